"""Prometheus metrics of the three services, each on its own `--metrics-port`.

Names follow vLLM's set with the `fermium_` prefix. Exported names (histograms also export
`_bucket`, `_sum`, `_count`; counters export `_total`):

router
    fermium_requests_total{outcome}            counter  outcome: stop | length | cancelled | error | rejected
    fermium_prompt_tokens_total                counter  prompt tokens of admitted requests
    fermium_generation_tokens_total            counter  tokens streamed to clients
    fermium_time_to_first_token_seconds        histogram
    fermium_inter_token_latency_seconds        histogram
    fermium_e2e_request_latency_seconds        histogram
    fermium_request_queue_time_seconds         histogram  admission queue wait
    fermium_request_prefill_time_seconds       histogram  dispatch -> first token
    fermium_request_decode_time_seconds        histogram  first token -> last token
    fermium_num_requests_running               gauge
    fermium_num_requests_waiting               gauge
    fermium_workers{role}                      gauge    live workers: prefill | decode
    fermium_snapshot_lookups_total             counter  prefix lookups (services/router/engine/prefix_cache.py)
    fermium_snapshot_hits_total                counter
    fermium_snapshot_misses_total              counter
    fermium_snapshot_tokens_saved_total        counter  prompt tokens not prefilled thanks to a hit
    fermium_snapshot_evictions_total           counter  snapshots evicted from RAM
    fermium_snapshot_stored_total{source}      counter  source: prefill | decode
    fermium_final_states_dropped_total{reason} counter  final states from decode not stored: unheld (the
                                                        snapshot their KV rows follow was gone) | invalid
    fermium_snapshot_bytes{tier}               gauge    tier: ram | disk
    fermium_snapshot_store_hits_total          counter  lookups served from the shared store (--snapshot-store)
    fermium_snapshot_store_writes_total        counter  snapshots written to the shared store
    fermium_snapshot_store_fallbacks_total{op} counter  op: lookup | store; the store was down, slow or full
    fermium_snapshot_store_reconnects_total    counter  the shared store came back after being down
    fermium_snapshot_store_up                  gauge    1 while the shared store answers
    fermium_snapshot_store_queue               gauge    snapshots waiting for the shared store's writer, or in it
    fermium_snapshot_store_rejected_total      counter  shared store entries refused: their MAC failed (forged,
                                                        or written under another --snapshot-key)
    fermium_snapshot_disk_writes_total{outcome} counter outcome: written | failed (e.g. disk full) | dropped
                                                        (the disk writer's queue was full)
    fermium_snapshot_disk_evictions_total      counter  snapshot files removed for --snapshot-disk-budget
    fermium_snapshot_disk_queue                gauge    snapshots waiting for the disk writer, or in it
    fermium_tool_call_parse_failures_total     counter  malformed spots in chat output, returned as content
    fermium_images_total                       counter  images in admitted requests (image_url parts)
    fermium_image_tokens_total                 counter  the image tokens they became
    fermium_state_bytes_sent_total{role}       counter  state bytes sent to workers: prefill | decode
    fermium_state_transfers_skipped_total      counter  prefills that ran on a state their worker held
                                                        (services/router/engine/placement.py), sending none
    fermium_state_bytes_skipped_total          counter  the bytes those states would have sent
    fermium_state_resends_total                counter  held states the worker no longer had, sent again
    fermium_clients_dropped_total{reason}      counter  clients cut off as too slow
                                                        (services/router/frontend/connections.py):
                                                        headers | body (not in within their timeouts) |
                                                        send (took no bytes for --send-timeout) | backlog
                                                        (more undelivered tokens than a request may hold)
prefill
    fermium_prefill_requests_total{outcome}    counter  outcome: ok | cancelled | error
    fermium_prefill_tokens_total               counter
    fermium_prefill_time_seconds               histogram  one prompt, backend compute
    fermium_prefill_weight_bytes_total         counter  weight bytes the backend moved (stats())
    fermium_prefill_weight_passes              histogram  one prompt's passes over the weights (stats() "passes":
                                                        a native CPU chunk, a CUDA pass); bytes / passes = a pass's
    fermium_prefill_backend_stat{key}          gauge    every numeric entry of backend.stats()
    fermium_prefill_images_total               counter  images through the vision encoder
    fermium_prefill_image_tokens_total         counter  the image tokens their rows filled
    fermium_prefill_encoder_seconds            histogram  one image through the vision encoder
    fermium_prefill_state_bytes_received_total{source}  counter  state bytes received: router | decode
    fermium_prefill_state_bytes_sent_total{kind}  counter  state bytes sent (arrays and logits): snapshot (to the
                                                        router: recurrent state and new KV rows) | final (to decode)
    fermium_prefill_held_lookups_total{outcome}  counter  requests that named a held state: hit | miss
    fermium_prefill_held_states                gauge    states kept in RAM for later requests (--held-budget)
    fermium_prefill_held_bytes                 gauge    their bytes
    fermium_num_requests_running / _waiting    gauge
    (fermium_prefill_backend_stat exists from startup for BACKEND_STAT_KEYS (0 until the backend reports them))
decode
    fermium_decode_requests_total{outcome}     counter  outcome: stop | length | cancelled | error
    fermium_decode_tokens_total                counter
    fermium_decode_step_seconds                histogram  one batched decode step
    fermium_decode_batch_size                  histogram  sequences per step
    fermium_decode_grammar_mask_seconds        histogram  one sequence's allowed-token mask, its worker's CPU time
    fermium_decode_spec_draft_tokens_total     counter  tokens the MTP block drafted and a verify judged
                                                        (--speculative mtp, common/speculative.py)
    fermium_decode_spec_accepted_tokens_total  counter  drafted tokens accepted
    fermium_decode_spec_acceptance_rate        gauge    accepted over drafted since start (0 before any draft)
    fermium_decode_state_bytes_sent_total{to}  counter  final-state bytes sent: router | prefill (HoldState)
    fermium_decode_sequences_peak              gauge    the most sequences held at once since start (never
                                                        above --capacity: the router holds the rest)
    fermium_num_requests_running / _waiting    gauge
every service
    fermium_protocol_errors_total{service,reason}  counter  messages rejected at the inbox or by the
        service: decode (undecodable) | too_large | recv | handler (the handler raised) |
        invalid (a request that fails the model's checks) | unexpected (a kind this service
        does not take) | unauthorized (a worker without the shared token)
Every service also exports prometheus_client's process_* series (process_cpu_seconds_total,
process_resident_memory_bytes, ...).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, start_http_server

# seconds: from a 1 ms loopback hop to a multi-minute prefill on the reference card
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                   0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PASS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# seconds: from one grammar's mask over a big vocabulary to a big batch's on a busy host
MASK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)
PROTOCOL_ERROR_REASONS = ("decode", "too_large", "recv", "handler", "invalid", "unexpected", "unauthorized")
# what a client the router cut off was late with: its headers, its body, taking its response, or
# taking its tokens (more undelivered than a request may buffer)
CLIENT_DROP_REASONS = ("headers", "body", "send", "backlog")
BACKEND_STAT_KEYS = ("h2d_bytes", "copy_seconds", "compute_seconds", "peak_device_bytes",
                     "vram_budget_bytes", "passes")  # the dashboard's series


def _with_values(metric, values: tuple[str, ...]):
    """Create the series of every known label value at 0, so rates and alerts see them at once."""
    for value in values:
        metric.labels(value)
    return metric


class _Metrics:
    SERVICE = ""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.protocol_errors = self.counter("fermium_protocol_errors", "Messages rejected, by reason",
                                            ("service", "reason"))
        for reason in PROTOCOL_ERROR_REASONS:
            self.protocol_errors.labels(self.SERVICE, reason)

    def protocol_error(self, reason: str) -> None:
        """Count one rejected message (reason: one of PROTOCOL_ERROR_REASONS)."""
        self.protocol_errors.labels(self.SERVICE, reason).inc()

    def counter(self, name: str, doc: str, labels: tuple[str, ...] = (), values: tuple[str, ...] = ()) -> Counter:
        return _with_values(Counter(name, doc, labels, registry=self.registry), values)

    def gauge(self, name: str, doc: str, labels: tuple[str, ...] = (), values: tuple[str, ...] = ()) -> Gauge:
        return _with_values(Gauge(name, doc, labels, registry=self.registry), values)

    def histogram(self, name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
        return Histogram(name, doc, buckets=buckets, registry=self.registry)

    def _load_gauges(self) -> None:
        self.running = self.gauge("fermium_num_requests_running", "Requests being processed")
        self.waiting = self.gauge("fermium_num_requests_waiting", "Requests waiting for a slot")

    def serve(self, port: int, host: str) -> None:
        """Expose /metrics on `host`:`port` (port 0 turns it off)."""
        if port:
            start_http_server(port, addr=host, registry=self.registry)


class RouterMetrics(_Metrics):
    SERVICE = "router"

    def __init__(self) -> None:
        super().__init__()
        self.requests = self.counter("fermium_requests", "Finished requests by outcome", ("outcome",),
                                     ("stop", "length", "cancelled", "error", "rejected"))
        self.prompt_tokens = self.counter("fermium_prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = self.counter("fermium_generation_tokens", "Tokens streamed to clients")
        self.ttft = self.histogram("fermium_time_to_first_token_seconds", "Arrival to first token")
        self.itl = self.histogram("fermium_inter_token_latency_seconds", "Time between two tokens")
        self.e2e = self.histogram("fermium_e2e_request_latency_seconds", "Arrival to last token")
        self.queue_time = self.histogram("fermium_request_queue_time_seconds", "Time in the admission queue")
        self.prefill_time = self.histogram("fermium_request_prefill_time_seconds", "Dispatch to first token")
        self.decode_time = self.histogram("fermium_request_decode_time_seconds", "First to last token")
        self.workers = self.gauge("fermium_workers", "Live workers by role", ("role",), ("prefill", "decode"))
        self.snapshot_lookups = self.counter("fermium_snapshot_lookups", "Prefix lookups")
        self.snapshot_hits = self.counter("fermium_snapshot_hits", "Lookups that found a stored prefix")
        self.snapshot_misses = self.counter("fermium_snapshot_misses", "Lookups that found nothing")
        self.snapshot_tokens_saved = self.counter("fermium_snapshot_tokens_saved",
                                                  "Prompt tokens not prefilled thanks to a snapshot")
        self.snapshot_evictions = self.counter("fermium_snapshot_evictions", "Snapshots evicted from RAM")
        self.snapshot_stored = self.counter("fermium_snapshot_stored", "Snapshots stored", ("source",),
                                            ("prefill", "decode"))
        self.final_states_dropped = self.counter("fermium_final_states_dropped", "Final states from decode not "
                                                 "stored", ("reason",), ("unheld", "invalid"))
        self.snapshot_bytes = self.gauge("fermium_snapshot_bytes", "Bytes held by the snapshot store", ("tier",),
                                         ("ram", "disk"))
        self.store_hits = self.counter("fermium_snapshot_store_hits", "Lookups served from the shared store")
        self.store_writes = self.counter("fermium_snapshot_store_writes", "Snapshots written to the shared store")
        self.store_fallbacks = self.counter("fermium_snapshot_store_fallbacks", "Shared store operations that "
                                            "fell back to the local tiers", ("op",), ("lookup", "store"))
        self.store_reconnects = self.counter("fermium_snapshot_store_reconnects",
                                             "Times the shared store came back after being down")
        self.store_up = self.gauge("fermium_snapshot_store_up", "1 while the shared store answers")
        self.store_queue = self.gauge("fermium_snapshot_store_queue", "Snapshots waiting for the shared store's "
                                      "writer, or in it")
        self.store_rejected = self.counter("fermium_snapshot_store_rejected", "Shared store entries whose MAC "
                                           "failed, dropped")
        self.disk_writes = self.counter("fermium_snapshot_disk_writes", "Snapshot files by outcome", ("outcome",),
                                        ("written", "failed", "dropped"))
        self.disk_evictions = self.counter("fermium_snapshot_disk_evictions", "Snapshot files removed for the "
                                           "disk budget")
        self.disk_queue = self.gauge("fermium_snapshot_disk_queue", "Snapshots waiting for the disk writer, or in it")
        self.tool_call_parse_failures = self.counter("fermium_tool_call_parse_failures",
                                                     "Malformed tool calls or reasoning tags in chat output")
        self.images = self.counter("fermium_images", "Images in admitted requests")
        self.image_tokens = self.counter("fermium_image_tokens", "Image tokens of admitted requests")
        self.state_bytes_sent = self.counter("fermium_state_bytes_sent", "State bytes sent to workers", ("role",),
                                             ("prefill", "decode"))
        self.state_transfers_skipped = self.counter("fermium_state_transfers_skipped",
                                                    "Prefills that ran on a state their worker held")
        self.state_bytes_skipped = self.counter("fermium_state_bytes_skipped", "State bytes not sent: held")
        self.state_resends = self.counter("fermium_state_resends", "Held states sent again: the worker had none")
        self.clients_dropped = self.counter("fermium_clients_dropped", "Requests or connections ended because "
                                            "the client was too slow, by what it was late with", ("reason",),
                                            CLIENT_DROP_REASONS)
        self._load_gauges()

    def client_dropped(self, reason: str) -> None:
        """Count one client cut off (reason: one of CLIENT_DROP_REASONS)."""
        self.clients_dropped.labels(reason).inc()


class PrefillMetrics(_Metrics):
    SERVICE = "prefill"

    def __init__(self) -> None:
        super().__init__()
        self.requests = self.counter("fermium_prefill_requests", "Prefill requests by outcome", ("outcome",),
                                     ("ok", "cancelled", "error"))
        self.tokens = self.counter("fermium_prefill_tokens", "Tokens prefilled")
        self.time = self.histogram("fermium_prefill_time_seconds", "Backend time of one prefill")
        self.weight_bytes = self.counter("fermium_prefill_weight_bytes", "Weight bytes moved by the backend")
        self.weight_passes = self.histogram("fermium_prefill_weight_passes",
                                            "Passes over the weights of one prefill, of the backend's size",
                                            buckets=PASS_BUCKETS)
        self.backend_stat = self.gauge("fermium_prefill_backend_stat", "Numeric backend stats", ("key",))
        self.images = self.counter("fermium_prefill_images", "Images through the vision encoder")
        self.image_tokens = self.counter("fermium_prefill_image_tokens", "Image tokens filled by the encoder")
        self.encoder_time = self.histogram("fermium_prefill_encoder_seconds", "One image through the vision encoder")
        self.state_bytes = self.counter("fermium_prefill_state_bytes_received", "State bytes received",
                                        ("source",), ("router", "decode"))
        self.state_bytes_sent = self.counter("fermium_prefill_state_bytes_sent", "State bytes sent", ("kind",),
                                             ("snapshot", "final"))
        self.held_lookups = self.counter("fermium_prefill_held_lookups", "Requests that named a held state",
                                         ("outcome",), ("hit", "miss"))
        self.held_states = self.gauge("fermium_prefill_held_states", "States kept for later requests")
        self.held_bytes = self.gauge("fermium_prefill_held_bytes", "Bytes of the states kept")
        for key in BACKEND_STAT_KEYS:
            self.backend_stat.labels(key).set(0)
        self._load_gauges()


class DecodeMetrics(_Metrics):
    SERVICE = "decode"

    def __init__(self) -> None:
        super().__init__()
        self.requests = self.counter("fermium_decode_requests", "Decoded sequences by outcome", ("outcome",),
                                     ("stop", "length", "cancelled", "error"))
        self.tokens = self.counter("fermium_decode_tokens", "Tokens sampled")
        self.step_time = self.histogram("fermium_decode_step_seconds", "One batched decode step")
        self.batch_size = self.histogram("fermium_decode_batch_size", "Sequences per decode step",
                                         buckets=BATCH_BUCKETS)
        self.grammar_mask_time = self.histogram("fermium_decode_grammar_mask_seconds",
                                                "One grammar mask, CPU seconds of its worker", buckets=MASK_BUCKETS)
        self.draft_tokens = self.counter("fermium_decode_spec_draft_tokens", "Drafted tokens that a verify judged")
        self.accepted_tokens = self.counter("fermium_decode_spec_accepted_tokens", "Drafted tokens accepted")
        self.acceptance_rate = self.gauge("fermium_decode_spec_acceptance_rate",
                                          "Accepted over drafted tokens since start")
        self.state_bytes = self.counter("fermium_decode_state_bytes_sent", "Final-state bytes sent", ("to",),
                                        ("router", "prefill"))
        self.sequences_peak = self.gauge("fermium_decode_sequences_peak", "Most sequences held at once since start")
        self._drafted = self._accepted = self._peak = 0
        self._load_gauges()

    def held(self, sequences: int) -> None:
        """The sequences held now (running and waiting), for the peak."""
        if sequences > self._peak:
            self._peak = sequences
            self.sequences_peak.set(sequences)

    def speculation(self, drafted: int, accepted: int) -> None:
        """Count one cycle's drafts and accepted drafts; the rate follows the counters."""
        if drafted:
            self.draft_tokens.inc(drafted)
            self.accepted_tokens.inc(accepted)
            self._drafted += drafted
            self._accepted += accepted
            self.acceptance_rate.set(self._accepted / self._drafted)
