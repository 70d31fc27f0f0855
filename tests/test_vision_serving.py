"""Images through the serving stack: the in-process stack (router API, prefill and decode servers) on
a tiny random Qwen3_5MoeForConditionalGeneration (tests/vision_helpers.py) answers a chat with an
image with the reference model's greedy tokens on the same prompt; two different images share no
snapshot past the first image token and a repeated image reuses its snapshot, whose rope delta
carries a longer prompt on; a bad image is a 400 naming its part, and a model without --mmproj
refuses image parts; the official `openai` client sends an image over HTTP, to the in-process
stack under uvicorn and to a real `fermium up --mmproj`, and gets the reference's text. The
native CPU runner's mRoPE and image rows against the reference, and its text rows unchanged; the
cuda backend's host side (emulated) against the reference on an image prompt."""
from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from common.metrics import RouterMetrics
from common.model.gguf_file import GGUFModel
from common.model.tokenizer import Tokenizer
from common.reference.model import ReferenceModel
from common.reference.multimodal import ImageEmbedding, place_images, text_input
from common.reference.vision import VisionEncoder
from common.vision.preprocess import preprocess
from common.vision.tensors import MmprojFile
from fermium.local import LocalDispatcher
from fermium.stack import free_port
from services.router.engine import Engine
from services.router.engine.admission import Admission
from services.router.engine.prefix_cache import build_snapshot_cache
from services.router.frontend.api import API
from services.router.frontend.template import chat_renderer
from services.router.frontend.vision import VisionInput
from tests.http_helpers import serve_app
from tests.stack_helpers import CHATML, _byte_chars
from tests.test_api_errors import lifespan
from tests.up_helpers import wait_healthy

from .vision_helpers import IMAGE_PAD, VISION_END, VISION_START, VOCAB, build_tiny_vl_checkpoint, synthetic_image

pytest.importorskip("torch")
pytest.importorskip("transformers")

MODEL = "fermium"
MAX_TOKENS = 6
SNAPSHOT_EVERY = 64
# as tests/test_cpu_runner.py: float weights, only the summation order differs
FLOAT_REL_TOL = 1e-4
SPECIALS = {285: "<|endoftext|>", 286: "<|im_start|>", 287: "<|im_end|>", VISION_START: "<|vision_start|>",
            VISION_END: "<|vision_end|>", IMAGE_PAD: "<|image_pad|>", 293: "<|video_pad|>"}


def write_tokenizer(d: Path) -> None:
    """A byte-level tokenizer.json whose specials sit at the ids the tiny model was made with."""
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)} | {"Ġt": 256, "he": 257}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in SPECIALS.items()]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                                               "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": ["Ġ t", "h e"]}}
    (d / "tokenizer.json").write_text(json.dumps(tok))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                         "eos_token": "<|im_end|>", "chat_template": CHATML}))


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    """The tiny model converted with a tokenizer: only printable ASCII can win a greedy pick (its LM
    head is zero elsewhere), so that the streamed text is the tokens exactly."""
    import torch

    from common.model.convert import convert
    from common.model.convert.mmproj import convert_mmproj
    root = tmp_path_factory.mktemp("vl-serving")
    hf = root / "hf"
    model = build_tiny_vl_checkpoint(hf)
    assert not model.config.get_text_config().tie_word_embeddings
    with torch.no_grad():
        head = model.lm_head.weight
        head[[i for i in range(VOCAB) if not 0x20 <= i < 0x7f]] = 0.0
    model.save_pretrained(hf)
    write_tokenizer(hf)
    text, mmproj = root / "text.gguf", root / "mmproj.gguf"
    convert(hf, text, "f32", progress=False)
    convert_mmproj(hf, mmproj, "f32", progress=False)
    gguf = GGUFModel(text)
    return gguf, mmproj, Tokenizer.from_gguf(gguf)


def png(height: int, width: int, seed: int) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(synthetic_image(height, width, seed), "RGB").save(buf, format="PNG")
    return buf.getvalue()


def image_part(data: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(data).decode()}}


def chat(text: str, data: bytes, after: str = "") -> dict:
    content = [{"type": "text", "text": text}, image_part(data)] + ([{"type": "text", "text": after}] if after else [])
    return {"model": MODEL, "temperature": 0, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": content}]}


def make_app(vl, *, mmproj: bool = True, prefill_runner=None, cache: bool = True, allow_urls: bool = False):
    model, mmproj_path, tok = vl
    metrics = RouterMetrics()
    store = build_snapshot_cache(model.config, metrics, 1 << 28, None, SNAPSHOT_EVERY) if cache else None
    dispatcher = LocalDispatcher(ReferenceModel(model), prefill_runner=prefill_runner or ReferenceModel(model),
                                 tokenizer=tok, cache=store, metrics=metrics,
                                 mmproj=str(mmproj_path) if mmproj else None)
    engine = Engine(tok, dispatcher, Admission(4, 8), metrics, 60.0)
    template = model.get("tokenizer.chat_template")
    vision = VisionInput.from_file(mmproj_path, tok.token_to_id, allow_urls) if mmproj else None
    api = API(engine, served=(MODEL,), context=model.config.context_length, vocab=tok.vocab_size, encode=tok.encode,
              decode=tok.decode, render=chat_renderer(template, True), tokenizer=tok,
              vision=vision)
    return api.app(lifespan=lifespan(dispatcher)), dispatcher, store


def reference_answer(vl, pieces: list) -> tuple[str, list[int]]:
    """The reference model's greedy answer to a user turn of text and image bytes, the prompt built by
    hand: the image between vision-start and -end, one image token per token of its grid."""
    from PIL import Image
    model, mmproj_path, tok = vl
    encoder, reference = VisionEncoder(MmprojFile(mmproj_path)), ReferenceModel(model)
    ids, embeds = tok.encode("<|im_start|>user\n"), []
    for piece in pieces:
        if isinstance(piece, str):
            ids += tok.encode(piece)
            continue
        patches = preprocess(Image.open(io.BytesIO(piece)).convert("RGB"), encoder.cfg)
        embeds.append(ImageEmbedding(patches.token_rows, patches.token_cols, encoder.encode(patches)))
        ids += [VISION_START] + [IMAGE_PAD] * patches.n_tokens + [VISION_END]
    ids += tok.encode("<|im_end|>\n<|im_start|>assistant\n")
    mm = place_images(ids, embeds, IMAGE_PAD, vision_start=VISION_START, vision_end=VISION_END)
    state = reference.new_state()
    logits, pos, out = reference.prefill(ids, state, mm=mm), mm.next_pos, []
    while len(out) < MAX_TOKENS:
        token = int(np.argmax(logits))
        if token in tok.eos_ids:
            break
        out.append(token)
        logits = reference.forward([token], state, recurrent=True, mm=text_input(pos, 1))[-1]
        pos += 1
    return tok.decode(out), ids


def ask(client, body) -> dict:
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("prefill", ["reference", "native"])
def test_a_chat_with_an_image_answers_as_the_reference(vl, prefill):
    from native.cpu_runner import CpuRunner
    image = png(64, 96, seed=1)
    want, ids = reference_answer(vl, ["what is this? ", image, " tell me"])
    runner = CpuRunner(vl[0], threads=1) if prefill == "native" else None
    app, dispatcher, _ = make_app(vl, prefill_runner=runner, cache=False)
    with TestClient(app) as client:
        reply = ask(client, chat("what is this? ", image, " tell me"))
        assert reply["usage"]["prompt_tokens"] == len(ids)
        assert reply["choices"][0]["message"]["content"] == want and want
        assert dispatcher.metrics.images._value.get() == 1
        assert dispatcher.metrics.image_tokens._value.get() == ids.count(IMAGE_PAD)
        prefill_metrics = dispatcher.servers[0].metrics
        assert prefill_metrics.images._value.get() == 1
        assert prefill_metrics.image_tokens._value.get() == ids.count(IMAGE_PAD)


# the text after the image is long enough that a prefill checkpoint (every 64 tokens) lands in it
AFTER = " and answer it in the fewest words that you can find for it"


def test_snapshots_key_the_image_and_carry_its_rope_delta(vl):
    a, b = png(64, 96, seed=1), png(64, 96, seed=2)
    app, _, store = make_app(vl)
    with TestClient(app) as client:
        first = ask(client, chat("look: ", a, AFTER))
        prompt = first["usage"]["prompt_tokens"]
        image_at = len(vl[2].encode("<|im_start|>user\nlook: ")) + 1      # after vision-start
        assert image_at + 12 < SNAPSHOT_EVERY < prompt                    # the checkpoint is past the image
        other = ask(client, chat("look: ", b, AFTER))
        assert cached(other) <= image_at                                  # nothing past the first image token
        assert other["choices"][0]["message"]["content"] == reference_answer(vl, ["look: ", b, AFTER])[0]
        again = ask(client, chat("look: ", a, AFTER))
        assert cached(again) == prompt                                    # the whole prompt, image and all
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        # a longer turn resumes after the image from the checkpoint, at the rotary position the image left
        longer = ask(client, chat("look: ", a, AFTER + ", please"))
        assert cached(longer) == SNAPSHOT_EVERY
        want, _ = reference_answer(vl, ["look: ", a, AFTER + ", please"])
        assert longer["choices"][0]["message"]["content"] == want
    # every snapshot is past the image (3 x 4 image tokens): the rotary position is 12 - max(3, 4) behind
    assert {s.rope_delta for s in store.store.snaps.values()} == {4 - 12}


@pytest.mark.parametrize("data,why", [(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "not a PNG, JPEG or WebP"),
                                      (None, "at least 2")])
def test_a_bad_image_is_a_400_naming_its_part(vl, data, why):
    if data is None:
        data = png(1, 1, seed=0)
    app, _, _ = make_app(vl, cache=False)
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=chat("see ", data))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1].image_url" and why in err["message"]
        truncated = png(64, 96, seed=3)[:-60]
        r = client.post("/v1/chat/completions", json=chat("see ", truncated))
        assert r.status_code == 400 and "messages[0].content[1]" in r.json()["error"]["message"]


def test_n_choices_share_the_image_prompt(vl):
    image = png(64, 96, seed=4)
    want, _ = reference_answer(vl, ["two of ", image])
    app, _, _ = make_app(vl, cache=False)                  # the copies wait for the prompt's end snapshot
    with TestClient(app) as client:
        reply = ask(client, {**chat("two of ", image), "n": 2})
    assert [c["message"]["content"] for c in reply["choices"]] == [want, want]


def test_image_urls_are_fetched_only_when_allowed(vl):
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route
    image = png(64, 96, seed=7)
    want, _ = reference_answer(vl, ["fetch ", image])
    images = Starlette(routes=[Route("/cat.png", lambda request: Response(image, media_type="image/png"))])
    with serve_app(images) as base:
        body = {**chat("fetch ", image)}
        body["messages"][0]["content"][1] = {"type": "image_url", "image_url": {"url": base + "/cat.png"}}
        for allow in (False, True):
            app, _, _ = make_app(vl, cache=False, allow_urls=allow)
            with TestClient(app) as client:
                r = client.post("/v1/chat/completions", json=body)
            if allow:
                assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == want
            else:
                assert r.status_code == 400 and "--allow-image-urls" in r.json()["error"]["message"]


def test_images_are_read_in_user_messages_only(vl):
    body = chat("see ", png(64, 96, seed=1))
    body["messages"] = [{"role": "system", "content": [image_part(png(64, 96, seed=1))]}, *body["messages"]]
    app, _, _ = make_app(vl, cache=False)
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages[0].content[0]" and "user messages" in r.json()["error"]["message"]


def test_without_mmproj_image_parts_are_refused(vl):
    app, _, _ = make_app(vl, mmproj=False, cache=False)
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json=chat("see ", png(64, 96, seed=1)))
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["param"] == "messages[0].content[1]" and "--mmproj" in err["message"]


def test_the_openai_client_sends_an_image(vl):
    openai = pytest.importorskip("openai")
    image = png(200, 120, seed=5)
    want, _ = reference_answer(vl, ["describe ", image])
    app, _, _ = make_app(vl, cache=False)
    with serve_app(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=[
            {"role": "user", "content": [{"type": "text", "text": "describe "}, image_part(image)]}])
    assert reply.choices[0].message.content == want and want


# ---- the runners


def image_prompt(vl):
    from PIL import Image
    model, mmproj_path, tok = vl
    encoder = VisionEncoder(MmprojFile(mmproj_path))
    embeds, ids = [], tok.encode("<|im_start|>user\nhi ")
    for h, w, seed in ((64, 96, 1), (200, 120, 2)):
        patches = preprocess(Image.fromarray(synthetic_image(h, w, seed), "RGB"), encoder.cfg)
        embeds.append(ImageEmbedding(patches.token_rows, patches.token_cols, encoder.encode(patches)))
        ids += [VISION_START] + [IMAGE_PAD] * patches.n_tokens + [VISION_END] + tok.encode(" and ")
    ids += tok.encode("<|im_end|>\n<|im_start|>assistant\n")
    return ids, place_images(ids, embeds, IMAGE_PAD, vision_start=VISION_START, vision_end=VISION_END)


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_native_mrope_and_image_rows_match_the_reference(vl):
    from native.cpu_runner import CpuRunner
    model = vl[0]
    ids, mm = image_prompt(vl)
    reference, native = ReferenceModel(model), CpuRunner(model, threads=2)
    rs, ns = reference.new_state(), native.new_state()
    want = reference.prefill(ids, rs, all_logits=True, mm=mm)
    got = native.prefill(ids, ns, all_logits=True, mm=mm, chunk=48)      # chunks that cut through an image
    assert rel(got, want) <= FLOAT_REL_TOL
    # decode after the images: text rows at pos + rope_delta, on both runners
    rs.rope_delta = ns.rope_delta = mm.next_pos - len(ids)
    assert rs.rope_delta < 0
    token = int(np.argmax(want[-1]))
    for _ in range(4):
        a, b = reference.decode([token], [rs])[0], native.decode([token], [ns])[0]
        assert rel(b, a) <= FLOAT_REL_TOL
        token = int(np.argmax(a))
    # the positions matter: without them the logits move well past the tolerance
    plain = native.prefill(ids, native.new_state(), all_logits=True)
    assert rel(plain, want) > 100 * FLOAT_REL_TOL


def test_native_text_rows_are_unchanged_by_the_mrope_path(vl):
    from native.cpu_runner import CpuRunner
    native = CpuRunner(vl[0], threads=2)
    ids = vl[2].encode("<|im_start|>user\nthe quick brown fox<|im_end|>\n")
    plain = native.prefill(ids, native.new_state(), all_logits=True)
    same = native.prefill(ids, native.new_state(), all_logits=True, mm=text_input(0, len(ids)))
    assert np.array_equal(plain, same)
    reference = ReferenceModel(vl[0]).prefill(ids, ReferenceModel(vl[0]).new_state(), all_logits=True)
    assert rel(plain, reference) <= FLOAT_REL_TOL


def test_cuda_backend_host_side_places_images(vl, monkeypatch):
    from services.prefill.backends import cuda as cuda_backend
    from tests.cuda_emulator import emulate_cuda
    emulate_cuda(monkeypatch)
    model = vl[0]
    ids, mm = image_prompt(vl)
    want = ReferenceModel(model).prefill(ids, ReferenceModel(model).new_state(), all_logits=True, mm=mm)
    backend = cuda_backend.CUDABackend(model, max_context=512, pass_tokens=64)
    got = backend.prefill(ids, backend_state(backend), all_logits=True, mm=mm)
    assert rel(got, want) <= 1e-3                        # tests/test_cuda_backend_emulated.py's LOGITS_ATOL scale


def backend_state(backend):
    from common.state import SequenceState
    return SequenceState.empty(backend.cfg, backend.kv_type)


# ---- the pieces: snapshot keys, the wire, checkpoints


def test_the_disk_tier_keeps_the_rope_delta_and_the_image_keys(vl, tmp_path):
    from common.snapshots import SnapshotStore
    cfg = vl[0].config
    tokens = [5] * 10 + [IMAGE_PAD] * 12 + [6] * 50
    state = ReferenceModel(vl[0]).new_state()
    ReferenceModel(vl[0]).prefill(tokens, state)
    state.rope_delta = -8
    logits = np.zeros(cfg.vocab_size, np.float32)
    mine, theirs = [(10, b"a" * 16)], [(10, b"b" * 16)]
    first = SnapshotStore(cfg, 1 << 30, block=16, disk_dir=tmp_path)
    first.put(tokens, state, logits, mine)
    assert first.flush(10)                                                     # the disk writer's thread
    again = SnapshotStore(cfg, 1 << 30, block=16, disk_dir=tmp_path)          # from the files alone
    found, _ = again.lookup(tokens + [7], mine)
    assert found.pos == len(tokens) and found.rope_delta == -8
    assert again.lookup(tokens + [7], theirs) is None
    assert again.lookup(tokens + [7]) is None                                # the image's key is not the text's


def test_a_prefill_request_carries_images_and_the_delta(vl):
    from common.protocol import decode_frames, encode_message
    from common.protocol.checks import check_prefill
    from common.protocol.prefill import PrefillRequest
    from common.sampling import SamplingParams
    cfg = vl[0].config
    pixels = synthetic_image(96, 128, seed=1)
    tokens = [5, VISION_START] + [IMAGE_PAD] * 12 + [VISION_END, 6]

    def request(**changes):
        fields = dict(rid="r", tokens=tokens, history=tokens, start_pos=0, decode_address="local://d",
                      sampling=SamplingParams(), max_tokens=4, stop_ids=[0], return_state=False, start_state=None,
                      snapshot_every=0, kv_type="f32", images=[pixels], image_token=IMAGE_PAD)
        return PrefillRequest(**{**fields, **changes})

    back = decode_frames(encode_message(request()))
    assert np.array_equal(back.images[0], pixels) and back.image_token == IMAGE_PAD
    check_prefill(back, cfg, "f32")
    with pytest.raises(ValueError, match="images\\[0\\]"):
        check_prefill(request(images=[pixels.astype(np.float32)]), cfg, "f32")
    with pytest.raises(ValueError, match="rope_delta"):
        check_prefill(request(rope_delta=-1), cfg, "f32")                 # a delta below position 0


def test_no_checkpoint_falls_inside_an_image(vl):
    from services.prefill.vision import inside_image, segment
    _, mm = image_prompt(vl)
    first = int(mm.rows[0])
    assert not inside_image(mm, first) and inside_image(mm, first + 1) and not inside_image(mm, first + 12)
    head, tail = segment(mm, 0, first + 12), segment(mm, first + 12, mm.n_rows)
    assert head.next_pos == tail.rope_pos[0, 0] and tail.next_pos == mm.next_pos
    assert len(head.rows) + len(tail.rows) == len(mm.rows)


def test_fermium_up_serves_an_image_to_the_openai_client(vl, tmp_path):
    """The real `fermium up` (router, prefill and decode processes, --mmproj on router and prefill)
    answers the openai client's image as the reference does."""
    openai = pytest.importorskip("openai")
    model, mmproj, _ = vl
    image = png(200, 120, seed=6)
    want, _ = reference_answer(vl, ["what now? ", image])
    port = free_port()
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "fermium", "up", "--model", str(model.path), "--mmproj", str(mmproj),
                           "--port", str(port), "--runner", "reference"], stdout=log, stderr=subprocess.STDOUT,
                          cwd=Path(__file__).resolve().parents[1], env={**os.environ, "FERMIUM_REPACK": "0"})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", up, 180, (tmp_path / "up.log").read_text, "fermium up", 0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reply = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=MAX_TOKENS, messages=[
            {"role": "user", "content": [{"type": "text", "text": "what now? "}, image_part(image)]}])
        assert reply.choices[0].message.content == want and want
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()
