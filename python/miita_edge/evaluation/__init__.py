"""Evaluation: the continual-learning harness of paper §4 (``miita-edge bench``).

Layer: the top of the library, above the facade. ``benchmarks`` reads the data, ``methods`` and
``baselines`` are what is evaluated, ``registry`` names them, ``runner`` plays the protocol and
fills the A matrix (``cl_matrix``), ``metrics`` scores answers, ``report`` writes the result
files, and ``extract_cache`` shares decode passes between the runs of a sweep.
"""
from .benchmarks import BENCHMARKS, BenchSpec, Stage, TestItem, get_benchmark, load_benchmark, parse_stages
from .methods import Context, Method
from .registry import METHODS, MethodInfo, get_method, register_method
from .runner import run_benchmark

__all__ = ["BENCHMARKS", "METHODS", "BenchSpec", "Context", "Method", "MethodInfo", "Stage", "TestItem",
           "get_benchmark", "get_method", "load_benchmark", "parse_stages", "register_method", "run_benchmark"]
