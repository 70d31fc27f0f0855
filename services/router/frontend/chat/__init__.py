"""Parsing what a chat model generates into OpenAI's message parts: reasoning, content, tool calls.

- message.py: Delta (one stream event), ToolCall, ParsedMessage, assemble().
- reasoning.py: the `</think>` split, streamed.
- tool_calls.py: Qwen3.6's XML tool calls in the content channel, streamed and fail-soft.
- arguments.py: parameter text typed by the tool's JSON schema.
- output.py: ChatOutputParser, both in sequence: what the API uses per choice.

Pure Python, no model or tokenizer: it works on detokenized text, so it runs in the router.
"""
from .message import Delta, ParsedMessage, ToolCall, ToolCallDelta, assemble
from .output import ChatOutputParser
from .reasoning import ReasoningParser, split_reasoning
from .tool_calls import ToolCallParser

__all__ = ["ChatOutputParser", "Delta", "ParsedMessage", "ReasoningParser", "ToolCall", "ToolCallDelta",
           "ToolCallParser", "assemble", "split_reasoning"]
