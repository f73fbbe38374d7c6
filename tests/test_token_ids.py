"""The answers' token dictionary as one Rice-coded list (memory/token_ids.py): checked against a
bit-by-bit writer written here from the layout in the module's docstring, and its reader's refusals."""
import numpy as np
import pytest

from miita_edge.memory.bank_arrays import dictionary_bytes, rows_are_smaller
from miita_edge.memory.token_ids import decode_token_ids, encode_token_ids, token_ids_nbytes


def reference_stream(ids: list[int]) -> bytes:
    """The layout written out plainly: the best k (the first of the fewest bits), the count as
    LEB128, then per id (its gap to the previous, minus one) q one-bits, a zero, k low bits."""
    gaps = [b - a - 1 for a, b in zip([-1] + ids, ids)]
    sizes = [sum(g >> k for g in gaps) + len(gaps) * (1 + k) for k in range(24)]
    k = sizes.index(min(sizes))
    head, n = [k], len(ids)
    while True:
        head.append((n & 127) | (128 if n >= 128 else 0))
        n >>= 7
        if not n:
            break
    bits = []
    for g in gaps:
        bits += [1] * (g >> k) + [0] + [(g >> i) & 1 for i in range(k)]
    bits += [0] * (-len(bits) % 8)
    body = [sum(bits[i + j] << j for j in range(8)) for i in range(0, len(bits), 8)]
    return bytes(head + body)


CASES = {
    "one": [0],
    "labels": [107, 529, 531, 532, 573, 580, 653, 684, 711, 850, 872, 974, 1003, 1041, 70000, 262143],
    "dense": list(range(40, 200)),  # 160 ids: a two-byte count
    "wide": [5, 16_777_215],
    "random": sorted(np.random.default_rng(0).choice(262_144, 300, replace=False).tolist()),
}


@pytest.mark.parametrize("name", CASES)
def test_the_stream_is_the_layout_and_reads_back(name):
    ids = CASES[name]
    got = encode_token_ids(np.array(ids))
    assert got.dtype == np.uint8 and got.tobytes() == reference_stream(ids)
    assert token_ids_nbytes(ids) == len(got)
    back = decode_token_ids(got)
    assert back.dtype == np.int32 and back.tolist() == ids


def test_the_dictionary_takes_the_smaller_form():
    labels = np.array(CASES["labels"])
    rows = 2 * len(labels) + 2  # two ids from 2^16
    assert dictionary_bytes(labels) == token_ids_nbytes(labels) <= rows  # a tie goes to the list
    assert not rows_are_smaller(labels)
    dense = np.array(CASES["dense"])
    assert dictionary_bytes(dense) == token_ids_nbytes(dense) < 2 * len(dense) // 4
    spread = np.array([3, 9_000_000])  # two ids far apart: 2 + 3 bytes as rows, more as a list
    assert token_ids_nbytes(spread) > 5 and rows_are_smaller(spread) and dictionary_bytes(spread) == 5


def test_what_it_never_writes_is_refused():
    good = encode_token_ids(np.array(CASES["labels"]))
    for why, buf in (("byte stream", good.astype(np.uint16)), ("byte stream", good[:1]),
                     ("Rice parameter", np.concatenate([[np.uint8(30)], good[1:]])),
                     ("does not say how many", np.array([3, 0x80, 0x80], np.uint8)),
                     ("shorter than", good[:-2]),
                     ("does not end", np.append(good, np.uint8(0)))):
        with pytest.raises(ValueError, match=why):
            decode_token_ids(buf)
    with pytest.raises(ValueError, match="ascending"):
        encode_token_ids(np.array([5, 5]))
    with pytest.raises(ValueError, match="past 2"):
        decode_token_ids(encode_token_ids(np.array([1 << 24])))
