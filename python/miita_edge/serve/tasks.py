"""Background task requests (Open WebUI's title, tags, follow-ups, search queries, autocomplete,
emoji, tool selection): answered unadapted and queued behind the user's answers.

Open WebUI marks them in its own request (``metadata.task``, e.g. ``"title_generation"``) but
removes ``metadata`` before it forwards a request to an OpenAI-compatible server, and sends the
task as one user message: its prompt template filled in (``open_webui/config.py``,
``DEFAULT_*_PROMPT_TEMPLATE``). They are recognised here by the templates' fixed phrases, which
Open WebUI has kept across versions: every chat-history task starts ``### Task:`` and quotes the
chat inside ``<chat_history>`` tags, and each task has its own instruction sentence. A client can
also say so itself: ``"miita": {"background": true}`` (or ``false`` to turn recognition off).

Such a request would teach the memory nothing and should not be steered by it: a title is not an
answer the memory was taught. docs/serving.md, "Background tasks".
"""
from __future__ import annotations

import re

# (task name as Open WebUI's TASKS enum spells it, a phrase of its default template), in the order
# they are tried; a custom template that keeps "### Task:" is still recognised, as "task".
PHRASES = (
    ("title_generation", r"Generate a concise, 3-5 word title|Generate a concise title summarizing the chat history"
                         r"|Create a concise, 3-5 word phrase as a header"),
    ("tags_generation", r"Generate 1-3 broad tags categorizing the main themes"),
    ("follow_up_generation", r"Suggest 3-5 relevant follow-up questions"
                             r"|Predict 3-5 useful messages this user might naturally send next"),
    ("query_generation", r"determine the necessity of generating search queries"),
    ("autocomplete_generation", r"You are an autocompletion system\."),
    ("image_prompt_generation", r"Generate a detailed prompt for an? image generation task"),
    ("emoji_generation", r"reflect the speaker's likely facial expression through a fitting emoji"),
    ("moa_response_generation", r"You have been provided with a set of responses from various models"),
    ("function_calling", r"choose and return the correct tool\(s\) from the list of available tools"),
)
_PHRASES = [(name, re.compile(p)) for name, p in PHRASES]
# Open WebUI's RAG template also starts "### Task:", but wraps the user's own question with the
# retrieved context (a chat with a file attached): that is an answer to give, not a background task.
_USER_TASK = re.compile(r"Respond to the user query using the provided context")
SCAN_CHARS = 4096  # the phrases stand near a template's top (or, after a long tool list, its end)


def _text(content) -> str:
    """A message's head and tail: bounded work whatever the message's length."""
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if not isinstance(content, str):
        return ""
    return content if len(content) <= 2 * SCAN_CHARS else content[:SCAN_CHARS] + "\n" + content[-SCAN_CHARS:]


def classify(messages) -> str | None:
    """The background task a conversation is, or None for a user's own question."""
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    heads = [_text(m.content) for m in messages if m.role == "system" or m is last_user]
    for name, rx in _PHRASES:
        if any(rx.search(h) for h in heads):
            return name
    if last_user is not None:
        head = _text(last_user.content).lstrip()
        if _USER_TASK.search(head):
            return None
        if head.startswith("### Task:") or ("<chat_history>" in head and "</chat_history>" in head):
            return "task"
    return None


def background_task(body) -> str | None:
    """The task a chat request is (``miita.background`` overrides recognition)."""
    flag = body.miita.background
    if flag is False:
        return None
    return classify(body.messages) or ("task" if flag else None)
