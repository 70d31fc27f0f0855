"""The in-process stack hands its tokenizer to decode, so a grammar can be built there; without
one, decode refuses grammars as before."""
from __future__ import annotations

import asyncio

import pytest

from common import grammar
from common.model.default import default_model_path
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from fermium.local import LocalDispatcher


class NoRunner:
    """A model's shapes and nothing to run: only the workers' start is needed here."""

    def __init__(self, cfg):
        self.cfg = cfg


def matcher_of(dispatcher: LocalDispatcher, spec: str):
    async def go():
        await dispatcher.start()
        try:
            return await asyncio.to_thread(dispatcher.servers[1].grammars.matcher, spec)
        finally:
            await dispatcher.close()
    return asyncio.run(go())


def test_local_dispatcher_gives_decode_the_tokenizer_grammars_need():
    model = GGUFModel(default_model_path())
    runner = NoRunner(model.config)
    assert matcher_of(LocalDispatcher(runner, tokenizer=Tokenizer.from_gguf(model)), 'start: "x"') is not None
    with pytest.raises(grammar.GrammarError, match="no tokenizer"):
        matcher_of(LocalDispatcher(runner), 'start: "x"')
