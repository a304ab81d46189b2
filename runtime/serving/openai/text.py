"""Text in and out: chat messages → prompt text, text → token ids, token ids → the text a
client may see so far (stop strings cut, incomplete characters held back)."""

from __future__ import annotations

from typing import Any, Sequence

REPLACEMENT = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


def render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    """The prompt text of a conversation, ending where the assistant's turn begins.

    Uses the tokenizer's chat template; a tokenizer without one (a base model's) gets a
    plain `role: content` transcript.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


def tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of `text` (a Hugging Face tokenizer). Chat prompts pass False: the template
    already holds BOS etc."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


def visible_text(text: str, stops: Sequence[str], finished: bool) -> str:
    """The part of the generated `text` a client may see now.

    Finished with a stop string: the text before its first occurrence (OpenAI omits the
    stop string). Still running: hold back an incomplete trailing character and the last
    len(longest stop) - 1 characters, which may be the start of a stop string.
    """
    if finished:
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        return text[: min(cuts)] if cuts else text
    text = text.rstrip(REPLACEMENT)
    hold = max((len(s) for s in stops), default=1) - 1
    return text[: len(text) - hold] if hold else text


def delta(sent: str, visible: str) -> str:
    """New text to send after `sent` (nothing if the decoder revised earlier text)."""
    return visible[len(sent):] if visible.startswith(sent) else ""
