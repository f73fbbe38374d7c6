"""Prompt templates: how an ``(input, output)`` row becomes model text.

The paper converts every benchmark "into the unified instruction-style format
(x, y)" (appendix C.1) without printing the prompts, so the templates here are
ours. What matters for MIITA:

* the semantic key (eq. 1) is pooled over the *prompt* tokens, the correction
  direction (eq. 2) over the *target* tokens, and ``h_q`` is taken at the last
  prompt token (the answer start), so prompt and target must be rendered
  separately and concatenated as ``prompt + target``;
* every target ends in ``"\\n"`` on purpose: the newline is the stop signal
  generation stops on, and learning it as part of the target (eq. 2) is what
  makes the model emit it. (An output that itself contains a newline, as a
  few SuperNI references do, can therefore only be generated up to its first
  line.)

Templates are filled with ``str.replace``, not ``str.format``: inputs contain
braces (code, JSON) that ``format`` would choke on.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["KEY_PROMPTS", "TEMPLATES", "Template", "canonical_text", "folded_text", "get_template", "key_template",
           "strip_lead", "truncate_words"]

#: Trailing characters that end a sentence or a question, not its content (``canonical_text``).
END_PUNCTUATION = ".?!;:,"


def canonical_text(text: str) -> str:
    """``text`` as one canonical sentence: runs of whitespace made one space, the trailing
    punctuation removed, lower case with the first letter upper. The same question typed in
    another case, with another end mark or other spacing is the same question, so it gets the
    same key (the words and their order are kept: those are what a paraphrase changes)."""
    t = " ".join(text.split()).rstrip(END_PUNCTUATION + " ").lower()
    return t[:1].upper() + t[1:]


#: A run of blanks other than newlines (``folded_text``).
_BLANKS = re.compile(r"[^\S\n]+")


def folded_text(text: str) -> str:
    """``text`` with what typing changes and meaning does not folded, and nothing else: every run of
    blanks other than a newline (spaces, tabs) made one space, and text typed in one case (all lower
    or all upper) put in sentence case. Newlines are kept (a context's layout is structure), and so
    are a prompt's trailing blank, mixed case (its capitals may be names), punctuation and words."""
    t = _BLANKS.sub(" ", text)
    if any(c.isalpha() for c in t) and (t == t.lower() or t == t.upper()):
        t = t.lower()
        i = next(i for i, c in enumerate(t) if c.isalpha())
        t = t[:i] + t[i].upper() + t[i + 1:]
    return t


def truncate_words(text: str, max_words: int) -> str:
    """First ``max_words`` whitespace-separated words, joined by single spaces.

    Text that already fits is returned unchanged (its whitespace kept), so
    truncation only touches the inputs it has to.
    """
    words = text.split()
    if len(words) <= max_words:
        return text
    return " ".join(words[:max_words])


@dataclass(frozen=True)
class Template:
    """A named prompt/target pair.

    ``prompt`` holds ``{input}`` exactly once and ``target`` holds ``{output}``
    exactly once. ``max_input_words`` (None = no limit) truncates long inputs
    to keep prompts within a small model's context on a CPU.
    """

    name: str
    prompt: str
    target: str
    max_input_words: int | None = None
    description: str = ""
    # The prompt holds the model's special tokens as text (a chat template's <|im_start|>...):
    # tokenise prompts with special-token parsing on (``Engine.parse_special``).
    special: bool = False
    # Inputs are put in ``canonical_text`` form before they are rendered (key prompts only).
    canonical: bool = False
    # Inputs are put in ``folded_text`` form before they are rendered (key prompts only).
    folded: bool = False

    def __post_init__(self) -> None:
        if self.prompt.count("{input}") != 1:
            raise ValueError(f"template {self.name!r}: prompt must contain {{input}} exactly once")
        if self.target.count("{output}") != 1:
            raise ValueError(f"template {self.name!r}: target must contain {{output}} exactly once")
        if not self.target.endswith("\n"):
            raise ValueError(f"template {self.name!r}: target must end in a newline (the stop signal)")
        if self.max_input_words is not None and self.max_input_words < 1:
            raise ValueError(f"template {self.name!r}: max_input_words must be >= 1")

    def render_prompt(self, x: str) -> str:
        """The model input for ``x`` (truncated first if ``max_input_words`` is set)."""
        if self.max_input_words is not None:
            x = truncate_words(x, self.max_input_words)
        if self.canonical:
            x = canonical_text(x)
        elif self.folded:
            x = folded_text(x)
        return self.prompt.replace("{input}", x)

    def render_target(self, y: str) -> str:
        """The text the model should continue the prompt with, stop newline included."""
        return self.target.replace("{output}", y)

    @property
    def lead(self) -> str:
        """The separator the target puts before the output (``" "`` after ``Answer:``): part of
        what the model generates, not of the reply a user reads (``strip_lead``)."""
        return self.target[: self.target.index("{output}")]


def strip_lead(text: str, lead: str) -> tuple[str, str]:
    """``(lead_removed, reply)``: ``text`` without the template's leading separator where it starts
    with it. A separator of spaces takes every leading space with it (a SentencePiece tokenizer
    renders the target's space as two). A text that is still a prefix of the separator (a stream's
    first bytes) shows as ``""``, so that every streamed prefix is a prefix of the final reply."""
    if not lead:
        return "", text
    if not lead.strip(" "):
        body = text.lstrip(" ")
        return text[: len(text) - len(body)], body
    if text.startswith(lead):
        return lead, text[len(lead):]
    if lead.startswith(text):
        return text, ""
    return "", text


TEMPLATES: dict[str, Template] = {
    t.name: t
    for t in (
        Template(
            "plain",
            "{input}\nAnswer:",
            " {output}\n",
            description="generic streams",
        ),
        Template(
            "banking77",
            "Classify the banking customer query into an intent.\nQuery: {input}\nIntent:",
            " {output}\n",
            description="Banking77 intent classification",
        ),
        Template(
            "dsc",
            "Classify the sentiment of the product review.\nReview: {input}\nSentiment:",
            " {output}\n",
            max_input_words=80,
            description="DSC product-review sentiment (reviews truncated to 80 words)",
        ),
        Template(
            # XQuAD rows already carry "Context: ...\nQuestion: ..." in `input`,
            # so the template adds only the instruction and the answer cue.
            "qa",
            "Answer the question with a short span copied from the context.\n{input}\nAnswer:",
            " {output}\n",
            description="extractive QA; input is 'Context: ...\\nQuestion: ...'",
        ),
        Template(
            # SuperNI inputs are a full instruction prompt ending in "Output: ".
            "superni",
            "{input}",
            "{output}\n",
            description="SuperNI; input is already the full prompt ending in 'Output: '",
        ),
    )
}


#: The name that asks for the model's own chat template (``chat_template``), and the one that picks
#: it when the model has one and ``plain`` otherwise (the default for a new memory).
CHAT = "chat"
AUTO = "auto"


def chat_template(source: str, name: str = CHAT) -> Template:
    """A template from a GGUF's Jinja chat template (``tokenizer.chat_template``): one user turn
    holding the input, then the assistant's turn, as the model was tuned to see a request. An
    instruct model's taught inputs and chat messages then render the same way, and its keys and
    answers come from the states it was trained on. Rendered once, sandboxed, with ``{input}`` as
    the message; the answer ends at the model's end of turn or the newline stop."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise InputError(f"chat template: {msg}")

    env.globals["raise_exception"] = raise_exception
    try:
        prompt = env.from_string(source).render(messages=[{"role": "user", "content": "{input}"}],
                                                bos_token="", eos_token="", add_generation_prompt=True)
    except InputError:
        raise
    except Exception as exc:  # jinja's own errors: a template we cannot render is the user's to know
        raise InputError(f"the model's chat template cannot be rendered: {type(exc).__name__}: {exc}"[:200]) from None
    if prompt.count("{input}") != 1:
        raise InputError("the model's chat template does not render one user message exactly once")
    return Template(name, prompt, "{output}\n", description="the model's own chat template", special=True)


def resolve_template(name: str | None, model_chat_template: str | None) -> Template:
    """The template a memory uses: ``chat`` (the model's own; an error for a model without one),
    ``auto``/None (``chat`` where the model has one, else ``plain``), or a named template."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key in (None, AUTO):
        return chat_template(model_chat_template) if model_chat_template else TEMPLATES["plain"]
    if key == CHAT:
        if not model_chat_template:
            raise InputError("template 'chat': this model has no chat template (tokenizer.chat_template); "
                             "use --template plain")
        return chat_template(model_chat_template)
    return get_template(name)


def get_template(name: str) -> Template:
    """Look a template up by name (case-insensitive); unknown -> one-line InputError."""
    key = name.strip().lower() if isinstance(name, str) else name
    try:
        return TEMPLATES[key]
    except (KeyError, TypeError):
        raise InputError(f"unknown template {name!r}; known templates: "
                         f"{', '.join(sorted(TEMPLATES) + [AUTO, CHAT])}") from None


#: How a key's prompt is written (``Preset.key_prompt``). "memory": the memory's own template, the
#: prompt the answer is generated from (eq. 1 as written). "meaning": the input alone, in
#: ``canonical_text`` form, inside a prompt that asks the model for its meaning in one word, the key
#: pooled where that word is due. A causal model's state at the end of its input holds what comes
#: next as much as what was said; asked for the meaning, the last state summarises the input, and
#: paraphrases of one request land nearer each other than under the answer's prompt (docs/method.md,
#: "The key prompt"; the wording is that of PromptEOL, Jiang et al. 2023, "Scaling Sentence
#: Embeddings with Large Language Models").
#: "canonical": the memory's own prompt with the input in ``canonical_text`` form, so the same
#: question typed in another case, end mark or spacing has the same key, while the prompt the answer
#: is generated from keeps the text as typed.
#: "folded": the memory's own prompt with the input in ``folded_text`` form (spacing, and text typed
#: in one case); where that changes nothing the answer's own prompt pass gives the key.
KEY_PROMPTS = {"memory": None, "canonical": "{memory}", "folded": "{memory}",
               "meaning": 'This sentence : "{input}" means in one word:"'}


def key_template(name: str, template: Template) -> Template:
    """The template a memory of ``template`` renders its keys' prompts with, by ``Preset.key_prompt``
    ``name``. Its name carries both, since everything derived from keys is cached per template name;
    it cuts inputs as ``template`` does and uses its special-token rule for tokenising."""
    if name not in KEY_PROMPTS:
        raise InputError(f"unknown key prompt {name!r}; known: {', '.join(KEY_PROMPTS)}")
    prompt = KEY_PROMPTS[name]
    if prompt is None:
        return template
    folded = name == "folded"
    if prompt == "{memory}":
        prompt = template.prompt
    return Template(f"{template.name}+{name}", prompt, template.target, max_input_words=template.max_input_words,
                    description=f"keys of {template.name!r}: {name}", special=template.special,
                    canonical=not folded, folded=folded)
