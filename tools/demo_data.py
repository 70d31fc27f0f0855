"""Chat data for the demo model, made from the play text and rendered with Qwen3.6's own template.

Speeches are the blank-line separated blocks of Tiny Shakespeare ("NAME:" then its lines). Each
conversation is one user request about a speech, with a short think block and an answer taken
from the text:
- continue: "Continue this speech" -> the speech's next lines;
- next speaker: "Who speaks next?" -> the next speech's speaker and first line;
- find: "Find the line that says X" -> a `lookup_line` tool call, its response, then the answer;
- count: "How many words are in this line" -> a `count_words` tool call, its response, the answer.
Half the conversations carry the two tool definitions (the template's tools system prompt);
the tool tasks always do. Everything is drawn from one seeded random.Random, so the same text
and seed give the same conversations.

A conversation becomes (text, trainable) pieces: the assistant turns (after
"<|im_start|>assistant\\n", through "<|im_end|>") are trainable, prompts and tool responses are
not, as in chat fine-tuning. Pieces end at special tokens, so tokenizing them one by one gives
the same ids as tokenizing the whole text.
"""
from __future__ import annotations

import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common.model.chat_template import default_template, render_chat  # noqa: E402
from fermium.demo import TOOLS  # noqa: E402  (the tools the demo offers are the ones it was trained on)

IGNORE = -100  # a label that takes no loss

ASSISTANT_OPEN = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>"
_SPEAKER = re.compile(r"^([A-Z][A-Za-z .']*):$")


@dataclass(frozen=True)
class Speech:
    speaker: str
    lines: tuple[str, ...]
    first_line: int  # 1-based line number of the speech's first line in the text


def speeches(text: str) -> list[Speech]:
    """The text's "NAME:\\nline\\n..." blocks, in order."""
    out, number = [], 1
    for block in text.split("\n\n"):
        rows = block.split("\n")
        lead = rows[0] if rows else ""
        if not lead:                      # a block begun by extra newlines
            number += len(rows) + 1
            continue
        body = tuple(r for r in rows[1:] if r.strip())
        if _SPEAKER.match(lead) and body:
            out.append(Speech(lead[:-1], body, number + 1))
        number += len(rows) + 1
    return out


def _words(line: str) -> list[str]:
    return line.split()


def _continue(rng: random.Random, speech: Speech, _next: Speech) -> list[dict] | None:
    if len(speech.lines) < 2:
        return None
    cut = rng.randint(1, min(2, len(speech.lines) - 1))
    given, rest = speech.lines[:cut], speech.lines[cut:cut + 4]
    user = f"Continue this speech by {speech.speaker}:\n" + "\n".join(given)
    think = f"{speech.speaker} is speaking. I will go on with the next lines of the speech."
    return [{"role": "user", "content": user},
            {"role": "assistant", "reasoning_content": think, "content": "\n".join(rest)}]


def _next_speaker(_rng: random.Random, speech: Speech, following: Speech) -> list[dict] | None:
    if following.speaker == speech.speaker:
        return None
    user = "Who speaks next?\n" + f"{speech.speaker}:\n" + "\n".join(speech.lines[-2:])
    think = f"{speech.speaker} has just spoken. In the scene {following.speaker} answers."
    answer = f"{following.speaker} speaks next:\n\n{following.speaker}:\n{following.lines[0]}"
    return [{"role": "user", "content": user},
            {"role": "assistant", "reasoning_content": think, "content": answer}]


def _find(rng: random.Random, speech: Speech, _next: Speech) -> list[dict] | None:
    row = rng.randrange(len(speech.lines))
    line, words = speech.lines[row], _words(speech.lines[row])
    if len(words) < 4:
        return None
    start = rng.randint(0, len(words) - 3)
    quote = " ".join(words[start:start + rng.randint(3, 4)])
    user = f'Find the line that says "{quote}"'
    think = f'The user wants the line with the words "{quote}". I will look it up.'
    result = f"line {speech.first_line + row}, {speech.speaker}: {line}"
    answer = f"{speech.speaker} says it, at line {speech.first_line + row}:\n{line}"
    return [{"role": "user", "content": user},
            {"role": "assistant", "reasoning_content": think, "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "lookup_line",
                                                              "arguments": {"words": quote}}}]},
            {"role": "tool", "content": result},
            {"role": "assistant", "reasoning_content": "The tool found the line. I will give it.",
             "content": answer}]


def _count(rng: random.Random, speech: Speech, _next: Speech) -> list[dict] | None:
    line = speech.lines[rng.randrange(len(speech.lines))]
    n = len(_words(line))
    user = f"How many words are in this line?\n{line}"
    think = "I should count the words with the tool."
    return [{"role": "user", "content": user},
            {"role": "assistant", "reasoning_content": think, "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "count_words",
                                                              "arguments": {"text": line}}}]},
            {"role": "tool", "content": str(n)},
            {"role": "assistant", "reasoning_content": "The tool counted them.",
             "content": f"The line has {n} words."}]


PLAIN_TASKS = (_continue, _next_speaker)
TOOL_TASKS = (_find, _count)


def conversations(text: str, count: int, seed: int) -> list[tuple[list[dict], bool]]:
    """`count` (messages, with_tools) pairs drawn from the text's speeches."""
    rng, found = random.Random(seed), speeches(text)
    out: list[tuple[list[dict], bool]] = []
    while len(out) < count:
        i = rng.randrange(len(found) - 1)
        with_tools = rng.random() < 0.5
        tasks = PLAIN_TASKS + TOOL_TASKS if with_tools else PLAIN_TASKS
        messages = rng.choice(tasks)(rng, found[i], found[i + 1])
        if messages is not None:
            out.append((messages, with_tools))
    return out


def render(messages: list[dict], with_tools: bool, template: str | None = None) -> str:
    """The whole conversation as Qwen3.6's template writes it (no generation prompt)."""
    return render_chat(messages, add_generation_prompt=False, tools=TOOLS if with_tools else None,
                       template=template or default_template())


def pieces(rendered: str) -> list[tuple[str, bool]]:
    """(text, trainable) spans of a rendered conversation: the assistant turns are trainable."""
    out: list[tuple[str, bool]] = []
    pos = 0
    while True:
        start = rendered.find(ASSISTANT_OPEN, pos)
        if start < 0:
            break
        body = start + len(ASSISTANT_OPEN)
        end = rendered.index(TURN_END, body) + len(TURN_END)
        out += [(rendered[pos:body], False), (rendered[body:end], True)]
        pos = end
    if pos < len(rendered):
        out.append((rendered[pos:], False))
    return [(t, trainable) for t, trainable in out if t]


def encode_chat(tok, rendered: str) -> tuple[list[int], list[bool]]:
    """A rendered conversation's ids and, per id, whether it is a trainable (assistant) token."""
    ids: list[int] = []
    trainable: list[bool] = []
    for text, train in pieces(rendered):
        part = tok.encode(text).ids
        ids += part
        trainable += [train] * len(part)
    return ids, trainable


def chat_rows(tok, text: str, plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Conversations packed in order into rows of chat_len + 1 tokens, the rest padded: ids and
    labels ([N, chat_len + 1]). labels[:, j] is ids[:, j] where that token is trained on and
    IGNORE elsewhere. A conversation longer than a row is left out."""
    pad, width = tok.token_to_id("<|endoftext|>"), plan.chat_len + 1
    rows, labels = [], []
    row: list[int] = []
    row_labels: list[int] = []

    def close_row() -> None:
        rows.append(row + [pad] * (width - len(row)))
        labels.append(row_labels + [IGNORE] * (width - len(row)))

    for messages, with_tools in conversations(text, plan.chats, plan.seed):
        ids, trainable = encode_chat(tok, render(messages, with_tools))
        if len(ids) > width:
            continue
        if len(row) + len(ids) > width:
            close_row()
            row, row_labels = [], []
        row += ids
        row_labels += [i if t else IGNORE for i, t in zip(ids, trainable)]
    if row:
        close_row()
    return torch.tensor(rows, dtype=torch.long), torch.tensor(labels, dtype=torch.long)


if __name__ == "__main__":
    import json
    source = Path(sys.argv[1] if len(sys.argv) > 1 else
                  Path(__file__).resolve().parents[2] / "shared/data/tinyshakespeare.txt")
    for msgs, tools in conversations(source.read_text(encoding="utf-8"), 4, 1):
        print(json.dumps(pieces(render(msgs, tools)), indent=1))
