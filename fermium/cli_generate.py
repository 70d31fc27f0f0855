"""`fermium generate`: in-process generation with the reference model (or a runner)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from common.engines import RUNNER, names_text
from common.sampling import SamplingParams
from fermium.options import command, config, options
from services.decode.config import DecodeConfig

RUNNER_OPTION = {"default": "reference", "help": f"{names_text(RUNNER)} (auto: native when it loads)."}


@command("model", "prompt", "chat", "max_tokens", options(SamplingParams, env=False), "think",
         options(DecodeConfig, "runner", env=False, runner=RUNNER_OPTION), options(DecodeConfig, "kv_type"),
         options(DecodeConfig, "speculative", "draft_tokens", "draft_vocab", env=False))
def generate_command(
    model: Optional[Path] = typer.Option(None, help="GGUF model file (default: the bundled demo model)."),
    prompt: Optional[str] = typer.Option(None, help="Raw text to continue."),
    chat: Optional[str] = typer.Option(None, help="A user message, rendered with the model's chat template."),
    max_tokens: int = typer.Option(64, min=1, help="Tokens to generate."),
    think: bool = typer.Option(False, help="With --chat: let the model think first (enable_thinking)."),
    threads: Optional[int] = typer.Option(None, help="Threads for the native runner."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    **settings,
):
    """Generate text from a prompt or a chat message, in this process; with --speculative mtp, the
    acceptance rate of the drafts at the end (on stderr, or in the JSON)."""
    from common.engines import load_runner
    from common.kv_cache import check_kv_type
    from common.model.chat_template import render_chat
    from common.model.gguf_file import GGUFModel
    from common.model.tokenizer import Tokenizer
    from common.reference.generate import generate
    from common.speculative import Speculator, check_mtp, check_settings, draft_vocab_ids

    if (prompt is None) == (chat is None):
        raise typer.BadParameter("give exactly one of --prompt or --chat")
    check_kv_type(settings["kv_type"])
    speculative, k, draft_vocab = settings["speculative"], settings["draft_tokens"], settings["draft_vocab"]
    check_settings(speculative, k, draft_vocab)
    if model is None:
        from common.model.default import default_model_path
        model = default_model_path()
    gguf_model = GGUFModel(model)
    tokenizer = Tokenizer.from_gguf(gguf_model)
    text = prompt if prompt is not None else render_chat(
        [{"role": "user", "content": chat}], enable_thinking=think,
        template=gguf_model.get("tokenizer.chat_template") if gguf_model.has("tokenizer.chat_template") else None)
    prompt_ids = tokenizer.encode(text)
    if len(prompt_ids) + max_tokens > gguf_model.config.context_length:
        raise typer.BadParameter(f"prompt ({len(prompt_ids)} tokens) + max_tokens exceeds the context "
                                 f"length {gguf_model.config.context_length}")
    try:
        params = config(SamplingParams, settings)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    if speculative == "mtp":
        check_mtp(gguf_model)
    _, runner = load_runner(settings["runner"], gguf_model, threads=threads, kv_type=settings["kv_type"])
    speculator = None
    if speculative == "mtp":
        check_mtp(gguf_model, runner)
        speculator = Speculator(runner, k, draft_ids=draft_vocab_ids(gguf_model, draft_vocab))
    stop = tokenizer.eos_ids
    tokens, stream = [], tokenizer.stream()
    for token in generate(runner, prompt_ids, params, max_tokens, stop, speculator=speculator):
        tokens.append(token)
        if not as_json and token not in stop:
            sys.stdout.write(stream.push(token))
            sys.stdout.flush()
    text_out = tokenizer.decode([t for t in tokens if t not in stop])
    drafts = ({"draft_tokens": k, "drafted": speculator.drafted, "accepted": speculator.accepted,
               "acceptance_rate": speculator.acceptance} if speculator else None)
    if as_json:
        print(json.dumps({"prompt_tokens": prompt_ids, "tokens": tokens, "text": text_out,
                          **({"speculative": drafts} if drafts else {})}))
        return
    sys.stdout.write("\n")
    if drafts:
        rate = "no drafts" if drafts["acceptance_rate"] is None else f"{100 * drafts['acceptance_rate']:.1f}%"
        print(f"speculative mtp, {k} draft tokens: {drafts['accepted']} of {drafts['drafted']} drafts accepted "
              f"({rate})", file=sys.stderr)
