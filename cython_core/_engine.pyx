# cython: language_level=3, boundscheck=False, wraparound=False
"""The Colibri engine in-process: the same C code as colibri-server, built
generic (dimensions read from the weights file instead of compiled in)."""

from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.stdint cimport int32_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

import threading

cdef extern from "platform/cpu_features.h" nogil:
    int cb_cpu_check(char *msg, size_t cap)

# First, before any engine code: an extension built for a CPU feature level
# this CPU lacks (COLIBRI_PY_TARGET) fails to import with the reason, not SIGILL.
cdef char _cpu_msg[1024]
if cb_cpu_check(_cpu_msg, sizeof(_cpu_msg)) != 0:
    raise ImportError(f"colibri_build._engine: {_cpu_msg.decode()}; reinstall with "
                      f"-C cmake.define.COLIBRI_PY_TARGET=<that target>")

import numpy as np


cdef extern from "engine.h" nogil:
    ctypedef struct cb_dims:
        uint32_t arch, n_layers, hidden, n_heads, n_kv_heads, head_dim, vocab, n_experts, top_k
        uint32_t expert_ffn, n_shared_experts, shared_ffn, context_len, router, weight_dtype
        float norm_eps, rope_theta
    ctypedef struct cb_tokenizer:
        pass
    ctypedef struct cb_engine:
        pass
    ctypedef struct cb_batch_item:
        int32_t token, slot, pos, want_logits, rope_len, llama_ubatch
    int32_t cb_llama_ubatch(int32_t offset, int32_t n)
    cb_engine *cb_engine_open(const char *model_dir, int n_threads, int n_slots, int kv, char *err, size_t err_len)
    size_t cb_engine_kv_bytes(const cb_engine *e)
    const char *cb_engine_kv_name(const cb_engine *e)
    void cb_engine_close(cb_engine *e)
    const cb_dims *cb_engine_dims(const cb_engine *e)
    int cb_engine_max_batch(const cb_engine *e)
    int cb_engine_logit_rows(const cb_engine *e)
    int cb_engine_n_slots(const cb_engine *e)
    ctypedef struct cb_memory_budget:
        size_t dense, experts, least_weights, working_set, kv_per_slot, arena, needs, least
        size_t kv_full_per_slot, kv_sliding_per_slot
        unsigned kv_sliding_rows, kv_window
        int slots
    void cb_engine_memory(const cb_engine *e, cb_memory_budget *m)
    const char *cb_engine_model_name(const cb_engine *e)
    const cb_tokenizer *cb_engine_tokenizer(const cb_engine *e)
    int cb_engine_forward(cb_engine *e, const cb_batch_item *items, int n_items, char *err, size_t err_len)
    const float *cb_engine_logits(const cb_engine *e, int row)
    const int32_t *cb_engine_routing(const cb_engine *e, int item, int layer)
    int32_t cb_argmax(const float *logits, int n)

cdef extern from "tokenizer.h" nogil:
    ctypedef struct cb_detok_state:
        pass
    int cb_tokenizer_load(cb_tokenizer *t, const char *path, char *err, size_t err_len)
    void cb_tokenizer_close(cb_tokenizer *t)
    int cb_tokenize_ex(const cb_tokenizer *t, const char *text, size_t len, int parse_special, int32_t *out,
                       int cap, char *err, size_t err_len)
    long cb_detokenize(const cb_tokenizer *t, const int32_t *ids, int n, char *out, size_t cap, int *bad)
    void cb_detok_init(cb_detok_state *s)
    int cb_detok_step(const cb_tokenizer *t, cb_detok_state *s, int32_t id, char *out, size_t cap)
    int cb_detok_flush(cb_detok_state *s, char *out, size_t cap)
    uint32_t cb_tokenizer_size(const cb_tokenizer *t)
    int cb_is_end_token(const cb_tokenizer *t, int32_t id)

cdef extern from "server/json.h" nogil:
    ctypedef struct cb_json_tok:
        pass
    int cb_json_parse(const char *json, size_t len, cb_json_tok *toks, int max_toks, size_t *err_offset)
    int cb_json_find(const char *json, const cb_json_tok *toks, int obj, const char *key)

cdef extern from "jinja.h" nogil:
    ctypedef struct cb_jinja:
        pass
    cb_jinja *cb_jinja_parse(const char *src, size_t len, char *err, size_t err_len)
    void cb_jinja_free(cb_jinja *t)


def chat_template_error(str template):
    """Why the engine's chat-template interpreter cannot parse template
    ("line N: reason"), or None."""
    data = template.encode()
    cdef char err[512]
    cdef cb_jinja *t = cb_jinja_parse(data, len(data), err, sizeof(err))
    if t == NULL:
        return err.decode(errors="replace")
    cb_jinja_free(t)
    return None


cdef extern from "chat.h" nogil:
    ctypedef struct cb_chat_request:
        const char *json
        const cb_json_tok *toks
        int messages, tools, kwargs, add_generation_prompt, continue_final
    size_t CB_CHAT_WORK_BYTES
    long cb_chat_apply(const cb_tokenizer *t, const cb_chat_request *q, void *work, size_t work_cap, char *text,
                       size_t cap, char *err, size_t err_len)


cdef extern from "build_config.h":
    const char *CB_KERNELS_NAME


class EngineError(RuntimeError):
    """The engine refused a model or a request (the message says why)."""


cdef list _encode(const cb_tokenizer *t, text, bint special):
    """Token ids of text (str, or bytes taken as they are)."""
    cdef bytes data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    cdef Py_ssize_t cap = 2 * len(data) + 2
    if cap > 0x7FFFFFFF:
        raise EngineError(f"text of {len(data)} bytes is too long to tokenize")
    out = np.empty(cap, dtype=np.int32)
    cdef int32_t[::1] out_v = out
    cdef char err[256]
    cdef const char *p = data
    cdef size_t n_bytes = len(data)
    cdef int n
    with nogil:
        n = cb_tokenize_ex(t, p, n_bytes, special, &out_v[0], <int>cap, err, sizeof(err))
    if n < 0:
        raise EngineError(err.decode(errors="replace"))
    return out[:n].tolist()


cdef str _decode(const cb_tokenizer *t, ids):
    """Text of ids; bytes that are not valid UTF-8 become U+FFFD."""
    arr = np.ascontiguousarray(ids, dtype=np.int64).ravel()
    if arr.size and (arr.min() < 0 or arr.max() >= cb_tokenizer_size(t)):
        bad = int(arr[(arr < 0) | (arr >= cb_tokenizer_size(t))][0])
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{cb_tokenizer_size(t) - 1})")
    ids32 = arr.astype(np.int32)
    cdef int32_t[::1] ids_v = ids32
    cdef size_t cap = 64
    cdef int bad_at = -1
    cdef long n = -1
    while n == -1:
        cap *= 4
        buf = bytearray(cap)
        n = cb_detokenize(t, &ids_v[0] if ids32.size else NULL, <int>ids32.size, buf, cap, &bad_at)
    return bytes(buf[:n]).decode("utf-8")


cdef list _decode_stream(const cb_tokenizer *t, ids):
    """The text each token adds when streamed: never a cut UTF-8 character."""
    cdef cb_detok_state st
    cdef char buf[4096]
    cdef int n
    cb_detok_init(&st)
    pieces = []
    for tok in ids:
        n = cb_detok_step(t, &st, <int32_t>tok, buf, sizeof(buf))
        if n == -2:
            raise ValueError(f"token id {tok} is outside the vocabulary")
        if n < 0:
            raise EngineError("token text longer than 4096 bytes")
        pieces.append(buf[:n].decode("utf-8"))
    n = cb_detok_flush(&st, buf, sizeof(buf))
    if pieces and n > 0:  # (wraparound is off in this module: no [-1])
        pieces[len(pieces) - 1] += buf[:n].decode("utf-8")
    return pieces


cdef str _format_chat(const cb_tokenizer *t, messages, tools, bint add_generation_prompt, bint continue_final,
                      kwargs):
    """The prompt text the server makes of messages with the model's template."""
    import json
    body = json.dumps({"messages": list(messages), "tools": tools, "kwargs": kwargs or {}},
                      ensure_ascii=False).encode()
    cdef int n_toks = cb_json_parse(body, len(body), NULL, 0, NULL)
    if n_toks < 0:
        raise EngineError("messages, tools and kwargs must be JSON values")
    cdef cb_json_tok *toks = <cb_json_tok *>PyMem_Malloc(sizeof(cb_json_tok) * n_toks)
    cdef void *work = PyMem_Malloc(CB_CHAT_WORK_BYTES)
    cdef size_t cap = 65536 + 8 * len(body)
    buf = bytearray(cap)
    cdef char err[512]
    cdef long got
    cdef cb_chat_request q
    try:
        if toks == NULL or work == NULL:
            raise MemoryError()
        cb_json_parse(body, len(body), toks, n_toks, NULL)
        q.json = body
        q.toks = toks
        q.messages = cb_json_find(body, toks, 0, b"messages")
        q.tools = cb_json_find(body, toks, 0, b"tools") if tools is not None else -1
        q.kwargs = cb_json_find(body, toks, 0, b"kwargs")
        q.add_generation_prompt = add_generation_prompt
        q.continue_final = continue_final
        got = cb_chat_apply(t, &q, work, CB_CHAT_WORK_BYTES, buf, cap, err, sizeof(err))
    finally:
        PyMem_Free(toks)
        PyMem_Free(work)
    if got < 0:
        raise EngineError(err.decode(errors="replace"))
    return bytes(buf[:got]).decode("utf-8", errors="replace")


cdef class Tokenizer:
    """Tokenizer(path): a tokenizer.cbt (or the model folder holding one),
    run by the engine's C code.

    encode(text, special=True) -> ids; decode(ids) -> str;
    decode_stream(ids) -> the text each token adds when streamed.
    Safe to share between threads: calls take turns (encoding works in the
    tokenizer's one scratch buffer, with the GIL released).
    """
    cdef cb_tokenizer *t
    cdef object _lock

    def __cinit__(self, path):
        from pathlib import Path
        self._lock = threading.Lock()
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.cbt"
        cdef char err[1024]
        self.t = <cb_tokenizer *>PyMem_Malloc(sizeof(cb_tokenizer))
        if self.t == NULL:
            raise MemoryError()
        if cb_tokenizer_load(self.t, str(p).encode(), err, sizeof(err)) != 0:
            PyMem_Free(self.t)
            self.t = NULL
            raise EngineError(err.decode(errors="replace"))

    def __dealloc__(self):
        if self.t != NULL:
            cb_tokenizer_close(self.t)
            PyMem_Free(self.t)

    def __len__(self):
        return cb_tokenizer_size(self.t)

    def encode(self, text, bint special=True):
        with self._lock:
            return _encode(self.t, text, special)

    def decode(self, ids):
        with self._lock:
            return _decode(self.t, ids)

    def decode_stream(self, ids):
        with self._lock:
            return _decode_stream(self.t, ids)

    def is_end_token(self, int tok):
        return bool(cb_is_end_token(self.t, tok))

    def format_chat(self, messages, tools=None, add_generation_prompt=True, continue_final=False, **kwargs):
        """The prompt text of messages (OpenAI-style dicts) as the server
        formats it: the model's chat template rendered by the C interpreter.
        kwargs are the template's extra variables (enable_thinking...)."""
        with self._lock:
            return _format_chat(self.t, messages, tools, add_generation_prompt, continue_final, kwargs)


cdef class Engine:
    """Engine(model_dir, threads=0, kv_cache=None): a model folder loaded in-process
    (kv_cache "f32" a float32 KV cache, transformers' numbers; "f16" keeps it
    in float16; "f16-llama" a float16 cache attended, and GELU rounded, as
    llama.cpp's CPU backend does: its answers; "auto" as the server does unless
    told: the model config's kv_cache, else f16, f32 for f32 weights; None: the
    model config's kv_cache (f16-llama for a GGUF conversion), else f32).

    forward(token_ids) -> float32 logits [len(token_ids), vocab]
    generate(prompt, max_tokens) -> generated text (greedy)

    One engine may be shared between threads: its calls take turns (one KV
    cache, one set of buffers, one thread pool), each as if it ran alone.
    close() (or leaving a with block) waits for the running call and frees
    the model; a closed engine raises EngineError.
    """
    cdef cb_engine *e
    cdef cb_batch_item *items
    cdef int max_batch, logit_rows
    cdef public object model_dir
    cdef object _routing
    # Held around every use of e: the C engine runs one batch at a time and
    # close() must not free it under a running call. Reentrant: generate
    # calls forward.
    cdef object _lock

    def __cinit__(self, model_dir, int threads=0, kv_cache=None):
        cdef char err[1024]
        err[0] = 0
        self._lock = threading.RLock()
        modes = ("f32", "f16", "auto", "f16-llama", None)  # enum cb_kv_type's order; None: CB_KV_MODEL_OR_F32
        if kv_cache not in modes:
            raise EngineError(f"kv_cache: got {kv_cache!r}, expected 'f32', 'f16', 'auto', 'f16-llama' or None")
        path = str(model_dir).encode()
        self.e = cb_engine_open(path, threads, 1, modes.index(kv_cache), err, sizeof(err))
        if self.e == NULL:
            raise EngineError(err.decode(errors="replace"))
        self.max_batch = cb_engine_max_batch(self.e)
        self.logit_rows = cb_engine_logit_rows(self.e)
        self.items = <cb_batch_item *>PyMem_Malloc(sizeof(cb_batch_item) * self.max_batch)
        if self.items == NULL:
            raise MemoryError()
        self.model_dir = str(model_dir)

    def __dealloc__(self):
        # No call can be running: it would hold a reference to self.
        if self.e != NULL:
            cb_engine_close(self.e)
            self.e = NULL
        PyMem_Free(self.items)
        self.items = NULL

    cdef cb_engine *_live(self) except NULL:
        """The C engine, or EngineError once closed (call with _lock held)."""
        if self.e == NULL:
            raise EngineError(f"engine of {self.model_dir} is closed")
        return self.e

    def close(self):
        """Frees the model and its buffers now (waits for a call running in
        another thread). Later calls raise EngineError; closing twice is fine."""
        with self._lock:
            if self.e != NULL:
                cb_engine_close(self.e)
                self.e = NULL

    @property
    def closed(self):
        return self.e == NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def kv_cache_bytes(self):
        with self._lock:
            return cb_engine_kv_bytes(self._live())

    @property
    def kv_cache(self):
        """"f32", "f16" or "f16-llama": what the KV cache holds ("auto" resolved)."""
        with self._lock:
            return cb_engine_kv_name(self._live()).decode()

    @property
    def memory(self):
        """The RAM the engine needs, in bytes (cb_engine_memory; the same
        figures as colibri_build.memory.budget)."""
        cdef cb_memory_budget m
        with self._lock:
            cb_engine_memory(self._live(), &m)
        return {"dense_bytes": m.dense, "experts_bytes": m.experts, "least_weights_bytes": m.least_weights,
                "expert_working_set_bytes": m.working_set, "kv_cache_bytes_per_slot": m.kv_per_slot,
                "kv_cache_full_bytes_per_slot": m.kv_full_per_slot,
                "kv_cache_sliding_bytes_per_slot": m.kv_sliding_per_slot, "kv_sliding_rows": m.kv_sliding_rows,
                "arena_bytes": m.arena, "slots": m.slots, "needs_bytes": m.needs, "least_bytes": m.least}

    @property
    def dims(self):
        cdef const cb_dims *d
        with self._lock:
            d = cb_engine_dims(self._live())
            return dict(layers=d.n_layers, hidden_size=d.hidden, heads=d.n_heads, kv_heads=d.n_kv_heads,
                        head_dim=d.head_dim, vocab_size=d.vocab, experts=d.n_experts, top_k=d.top_k,
                        expert_ffn_size=d.expert_ffn, context_length=d.context_len, norm_eps=d.norm_eps,
                        rope_theta=d.rope_theta)

    @property
    def name(self):
        with self._lock:
            return cb_engine_model_name(self._live()).decode()

    @property
    def kernels(self):
        return CB_KERNELS_NAME.decode()

    @property
    def last_routing(self):
        """Experts chosen by the last forward(): int32 [tokens, layers, top_k]."""
        with self._lock:
            return self._routing

    def forward(self, token_ids, bint all_logits=True, int start=0, int chunk=0):
        """Runs token_ids from position start and returns logits at every
        position ([tokens, vocab]), or with all_logits=False at the last one
        only ([1, vocab]: as the server prefills a prompt, the last layer's
        FFN runs for that token alone). With start > 0 the tokens continue
        the ones an earlier call ran at positions 0..start-1. With dynamic NTK
        RoPE the call is one transformers call: every token is rotated for
        the sequence length start + len(token_ids). chunk: tokens a step
        (1..max_batch; 0: max_batch, or the logit rows with all_logits).
        In f16-llama a call is one llama.cpp prompt: 64 tokens or more
        attend as its tiled flash attention, fewer as its decode (engine.h)."""
        ids = np.ascontiguousarray(token_ids, dtype=np.int32).ravel()
        if chunk < 0 or chunk > self.max_batch:
            raise ValueError(f"chunk: got {chunk}, expected 0..{self.max_batch}")
        with self._lock:
            return self._forward(ids, all_logits, start, chunk)

    @property
    def max_batch_tokens(self):
        """Most tokens one step runs (the prefill chunk)."""
        return self.max_batch

    cdef object _forward(self, ids, bint all_logits, int start, int step=0):
        cdef cb_engine *e = self._live()
        cdef const cb_dims *d = cb_engine_dims(e)
        cdef int n = ids.shape[0]
        if n < 1:
            raise ValueError("forward() needs at least one token")
        if start < 0 or start + n > <int>d.context_len:
            raise ValueError(f"positions {start}..{start + n - 1} exceed the context length {d.context_len}")
        out = np.empty((n if all_logits else 1, d.vocab), dtype=np.float32)
        routing = np.empty((n, d.n_layers, d.top_k), dtype=np.int32)
        cdef float[:, ::1] out_v = out
        cdef int32_t[::1] ids_v = ids
        cdef int done = 0, chunk, i, rc
        cdef char err[1024]
        if step == 0:  # every token wants logits: as many as the engine holds
            step = min(self.max_batch, self.logit_rows) if all_logits else self.max_batch
        elif all_logits:
            step = min(step, self.logit_rows)
        while done < n:
            chunk = min(step, n - done)
            for i in range(chunk):
                self.items[i].token = ids_v[done + i]
                self.items[i].slot = 0
                self.items[i].pos = start + done + i
                self.items[i].want_logits = 1 if all_logits or done + i == n - 1 else 0
                self.items[i].rope_len = start + n  # dynamic NTK RoPE: one transformers call over them
                self.items[i].llama_ubatch = cb_llama_ubatch(done + i, n)  # f16-llama: one llama.cpp prompt
            with nogil:
                rc = cb_engine_forward(e, self.items, chunk, err, sizeof(err))
            if rc != 0:
                raise EngineError(err.decode(errors="replace"))
            for i in range(chunk):
                if all_logits:
                    memcpy(&out_v[done + i, 0], cb_engine_logits(e, i), sizeof(float) * d.vocab)
                elif done + i == n - 1:
                    memcpy(&out_v[0, 0], cb_engine_logits(e, 0), sizeof(float) * d.vocab)
                routing[done + i] = self._routing_of(i)
            done += chunk
        self._routing = routing
        return out

    cdef object _routing_of(self, int item):
        """Experts of the item-th token of the last batch: int32 [layers, top_k]."""
        cdef const cb_dims *d = cb_engine_dims(self.e)
        out = np.empty((d.n_layers, d.top_k), dtype=np.int32)
        cdef int32_t[:, ::1] out_v = out
        cdef int layer
        for layer in range(<int>d.n_layers):
            memcpy(&out_v[layer, 0], cb_engine_routing(self.e, item, layer), sizeof(int32_t) * d.top_k)
        return out

    def generate_ids(self, prompt_ids, int max_tokens=16, bint stop_at_end=True):
        """Greedy continuation of prompt_ids: the new token ids. Afterwards
        last_routing holds the experts of every token fed (prompt and
        generated)."""
        ids = np.ascontiguousarray(prompt_ids, dtype=np.int32).ravel()
        with self._lock:  # the whole generation: no other call moves the KV cache in between
            return self._generate_ids(ids, max_tokens, stop_at_end)

    cdef list _generate_ids(self, ids, int max_tokens, bint stop_at_end):
        cdef cb_engine *e = self._live()
        cdef const cb_dims *d = cb_engine_dims(e)
        cdef float[:, ::1] prompt_logits = self._forward(ids, False, 0)
        cdef int pos = len(self._routing)
        cdef int32_t tok = cb_argmax(&prompt_logits[0, 0], d.vocab)
        cdef char err[1024]
        cdef int rc
        generated = []
        routing = [self._routing]
        while len(generated) < max_tokens:
            generated.append(tok)
            if stop_at_end and cb_is_end_token(cb_engine_tokenizer(e), tok):
                break
            if len(generated) == max_tokens or pos >= <int>d.context_len:
                break
            self.items[0].token = tok
            self.items[0].slot = 0
            self.items[0].pos = pos
            self.items[0].want_logits = 1
            self.items[0].rope_len = 0  # a call of its own: pos + 1
            self.items[0].llama_ubatch = 1
            with nogil:
                rc = cb_engine_forward(e, self.items, 1, err, sizeof(err))
            if rc != 0:
                raise EngineError(err.decode(errors="replace"))
            routing.append(self._routing_of(0)[None])
            tok = cb_argmax(cb_engine_logits(e, 0), d.vocab)
            pos += 1
        self._routing = np.concatenate(routing)
        return generated

    def tokenize(self, text, bint special=True):
        """Token ids of text with the model's tokenizer (special tokens
        written in the text are parsed unless special=False)."""
        with self._lock:
            return _encode(cb_engine_tokenizer(self._live()), text, special)

    def detokenize(self, ids):
        """The text of ids (invalid UTF-8 across them becomes U+FFFD)."""
        with self._lock:
            return _decode(cb_engine_tokenizer(self._live()), ids)

    def format_chat(self, messages, tools=None, add_generation_prompt=True, continue_final=False, **kwargs):
        """The prompt text the server makes of chat messages (real tokenizers)."""
        with self._lock:
            return _format_chat(cb_engine_tokenizer(self._live()), messages, tools, add_generation_prompt,
                                continue_final, kwargs)

    def generate(self, prompt, int max_tokens=16):
        """Greedy continuation of a text prompt (no chat template): the new text."""
        with self._lock:
            return self.detokenize(self.generate_ids(self.tokenize(prompt), max_tokens))


# ---- kernels, for tests: the build's own kernels and the scalar references ----

cdef extern from "kernels/kernels.h" nogil:
    ctypedef struct cb_block_q8_0:
        pass
    ctypedef struct cb_block_q8_k:
        pass
    ctypedef struct cb_tensor:
        const void *data
        uint32_t dtype, rows, cols
    ctypedef struct cb_act:
        const float *x
        const cb_block_q8_0 *q
        int x_stride, q_stride
        const cb_block_q8_k *k
        int k_stride
        const float *q8_1_fix
    ctypedef enum cb_store:
        CB_SET
    void cb_matmul_tile(const cb_tensor *W, int r0, int r1, const cb_act *A, const int32_t *inp, int n_tok,
                        float *Y, int y_stride, const int32_t *out, cb_store mode, const float *scale)
    void cb_q8_1_fixes(const float *x, const cb_block_q8_0 *q, int n, float *fix)
    ctypedef struct cb_block_q4_0:
        pass
    void cb_quantize_row_q8_0(const float *x, cb_block_q8_0 *y, int n)
    void cb_quantize_act_q8_0(const float *x, cb_block_q8_0 *y, int n)
    void cb_quantize_row_q4_0(const float *x, cb_block_q4_0 *y, int n)
    void cb_dequantize_row(uint32_t dtype, const void *row, float *out, int n)
    float cb_dot_f32_scalar(const float *a, const float *b, int n)
    float cb_dot_f16_scalar(const uint16_t *w, const float *x, int n)
    float cb_dot_bf16_scalar(const uint16_t *w, const float *x, int n)
    float cb_dot_q8_0_scalar(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n)
    float cb_dot_q4_0_scalar(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n)
    float cb_dot_f32(const float *a, const float *b, int n)
    float cb_dot_f16(const uint16_t *w, const float *x, int n)
    float cb_dot_bf16(const uint16_t *w, const float *x, int n)
    float cb_dot_q8_0(const cb_block_q8_0 *w, const cb_block_q8_0 *x, int n)
    float cb_dot_q4_0(const cb_block_q4_0 *w, const cb_block_q8_0 *x, int n)
    void cb_rmsnorm(float *out, const float *x, const float *w, int n, float eps)
    void cb_rope_neox(float *vec, int n_heads, int head_dim, const float *cos_pos, const float *sin_pos)
    void cb_softmax(float *x, int n)
    ctypedef float (*cb_dot_block_fn)(const void *w, const cb_block_q8_0 *x, int n)
    cb_dot_block_fn cb_dot_block_scalar(uint32_t dtype)
    cb_dot_block_fn cb_dot_block(uint32_t dtype)
    void cb_quantize_row_q8_k(const float *x, cb_block_q8_k *y, int n)
    void cb_quantize_act_q8_k(const float *x, cb_block_q8_k *y, int n)
    ctypedef float (*cb_dot_k_fn)(const void *w, const cb_block_q8_k *x, int n)
    cb_dot_k_fn cb_dot_k_scalar(uint32_t dtype)
    cb_dot_k_fn cb_dot_k(uint32_t dtype)

cdef extern from "router.h" nogil:
    void cb_topk(const float *values, int n, int k, int32_t *ids)

# ---- SHA-256, for tests: the code colibri-server --verify runs ----

cdef extern from "sha256.h" nogil:
    ctypedef struct cb_sha256:
        pass
    void cb_sha256_init(cb_sha256 *s)
    void cb_sha256_update(cb_sha256 *s, const void *data, size_t len)
    void cb_sha256_final(cb_sha256 *s, unsigned char digest[32])
    int cb_sha256_file(const char *path, char hex[65], uint64_t *bytes, void *progress, void *ctx,
                       char *err, size_t err_len)


def sha256(data, Py_ssize_t piece=0):
    """The engine's SHA-256 of bytes, fed piece bytes at a time (0: at once): hex."""
    cdef const unsigned char[::1] v = np.frombuffer(bytes(data), dtype=np.uint8) if len(data) else np.zeros(1, np.uint8)
    cdef Py_ssize_t n = len(data), at = 0, step = piece if piece > 0 else max(n, 1)
    cdef cb_sha256 s
    cdef unsigned char digest[32]
    cb_sha256_init(&s)
    while at < n:
        cb_sha256_update(&s, &v[at], min(step, n - at))
        at += step
    cb_sha256_final(&s, digest)
    return bytes(digest[:32]).hex()


def sha256_file(path):
    """The engine's streamed SHA-256 of a file (what colibri-server --verify
    computes): hex."""
    cdef char hex_[65]
    cdef char err[1024]
    cdef uint64_t n = 0
    cdef bytes p = str(path).encode()
    cdef const char *c_path = p
    cdef int rc
    with nogil:
        rc = cb_sha256_file(c_path, hex_, &n, NULL, NULL, err, sizeof(err))
    if rc != 0:
        raise EngineError(err.decode(errors="replace"))
    return hex_[:64].decode()


_DTYPE_IDS = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_0": 4, "q4_0x4": 6, "q8_0x4": 7,
              "q4_1": 8, "q5_0": 9, "q5_1": 10, "q2_k": 11, "q3_k": 12, "q4_k": 13, "q5_k": 14, "q6_k": 15,
              "iq4_nl": 16, "iq4_xs": 17, "mxfp4": 18}


def _f32(x):
    return np.ascontiguousarray(x, dtype=np.float32)


def quantize(x, dtype, bint engine=False):
    """One row of float32 -> the C quantizer's bytes (q8_0, q4_0, or q8_k:
    the K types' activations, 292 bytes a 256); with engine=True the
    engine's (SIMD) activation quantizer for q8_0 or q8_k."""
    cdef float[::1] xv = _f32(x).ravel()
    cdef int n = xv.shape[0]
    if n % (256 if dtype == "q8_k" else 32):
        raise ValueError("length must be a multiple of 256 for q8_k, else 32")
    out = np.zeros(n // 256 * 292 if dtype == "q8_k" else n // 32 * (34 if dtype == "q8_0" else 18), dtype=np.uint8)
    cdef unsigned char[::1] ov = out
    if dtype == "q8_k" and engine:
        cb_quantize_act_q8_k(&xv[0], <cb_block_q8_k *>&ov[0], n)
    elif dtype == "q8_k":
        cb_quantize_row_q8_k(&xv[0], <cb_block_q8_k *>&ov[0], n)
    elif dtype == "q8_0" and engine:
        cb_quantize_act_q8_0(&xv[0], <cb_block_q8_0 *>&ov[0], n)
    elif dtype == "q8_0":
        cb_quantize_row_q8_0(&xv[0], <cb_block_q8_0 *>&ov[0], n)
    elif dtype == "q4_0":
        cb_quantize_row_q4_0(&xv[0], <cb_block_q4_0 *>&ov[0], n)
    else:
        raise ValueError(dtype)
    return out


def dequantize(raw, dtype, int n):
    """A row in any dtype's bytes -> float32 [n]."""
    data = np.ascontiguousarray(raw, dtype=np.uint8)
    cdef const unsigned char[::1] rv = data
    out = np.empty(n, dtype=np.float32)
    cdef float[::1] ov = out
    cb_dequantize_row(_DTYPE_IDS[dtype], &rv[0], &ov[0], n)
    return out


def dot(dtype, w_raw, x, bint scalar=False):
    """One weight row (dtype bytes) . x (float32; quantized to q8_0 first for
    the block types, to q8_k for those whose kernels take it: dims.h
    cb_wants_q8_k), with this build's
    kernel or the scalar reference."""
    cdef const float[::1] xv = _f32(x).ravel()
    cdef int n = xv.shape[0]
    data = np.ascontiguousarray(w_raw, dtype=np.uint8)
    cdef const unsigned char[::1] wv = data
    cdef const unsigned char[::1] qv
    if dtype == "f32":
        return cb_dot_f32_scalar(<const float *>&wv[0], &xv[0], n) if scalar else cb_dot_f32(<const float *>&wv[0], &xv[0], n)
    if dtype == "f16":
        return cb_dot_f16_scalar(<const uint16_t *>&wv[0], &xv[0], n) if scalar else cb_dot_f16(<const uint16_t *>&wv[0], &xv[0], n)
    if dtype == "bf16":
        return cb_dot_bf16_scalar(<const uint16_t *>&wv[0], &xv[0], n) if scalar else cb_dot_bf16(<const uint16_t *>&wv[0], &xv[0], n)
    qv = quantize(np.asarray(xv), "q8_0")
    if dtype == "q8_0":
        if scalar:
            return cb_dot_q8_0_scalar(<const cb_block_q8_0 *>&wv[0], <const cb_block_q8_0 *>&qv[0], n)
        return cb_dot_q8_0(<const cb_block_q8_0 *>&wv[0], <const cb_block_q8_0 *>&qv[0], n)
    if dtype == "q4_0":
        if scalar:
            return cb_dot_q4_0_scalar(<const cb_block_q4_0 *>&wv[0], <const cb_block_q8_0 *>&qv[0], n)
        return cb_dot_q4_0(<const cb_block_q4_0 *>&wv[0], <const cb_block_q8_0 *>&qv[0], n)
    cdef cb_dot_k_fn kfn = NULL
    if dtype in _DTYPE_IDS:
        kfn = cb_dot_k_scalar(_DTYPE_IDS[dtype]) if scalar else cb_dot_k(_DTYPE_IDS[dtype])
    if kfn != NULL:
        qv = quantize(np.asarray(xv), "q8_k")
        return kfn(&wv[0], <const cb_block_q8_k *>&qv[0], n)
    cdef cb_dot_block_fn fn = NULL
    if dtype in _DTYPE_IDS:  # GGML's other block types (ids 8..18)
        fn = cb_dot_block_scalar(_DTYPE_IDS[dtype]) if scalar else cb_dot_block(_DTYPE_IDS[dtype])
    if fn == NULL:
        raise ValueError(dtype)
    return fn(&wv[0], <const cb_block_q8_0 *>&qv[0], n)


def matmul(dtype, w_raw, int rows, x, int r0=0, int r1=-1, bint q8_1_min=False):
    """Y [tokens, rows] = W x for x [tokens, cols] through the engine's matrix
    kernel (rows r0..r1 only; the rest stay 0), activations quantized to q8_0
    (and q8_k, for whole 256s) for the block types as the engine does. W may be x4 (q8_0x4, q4_0x4:
    whole groups of four rows). q8_1_min: q4_1/q5_1 min terms as f16-llama
    takes them (llama.cpp's q8_1 block sums)."""
    x2 = np.atleast_2d(_f32(x))
    cdef const float[:, ::1] xv = x2
    cdef int n_tok = xv.shape[0], cols = xv.shape[1]
    data = np.ascontiguousarray(w_raw, dtype=np.uint8)
    cdef const unsigned char[::1] wv = data
    out = np.zeros((n_tok, rows), dtype=np.float32)
    cdef float[:, ::1] ov = out
    cdef cb_tensor W
    W.data = &wv[0]
    W.dtype = _DTYPE_IDS[dtype]
    W.rows = rows
    W.cols = cols
    cdef cb_act A
    A.x = &xv[0, 0]
    A.x_stride = cols
    A.q = NULL
    A.q_stride = cols // 32
    A.k = NULL
    A.k_stride = cols // 256
    A.q8_1_fix = NULL
    cdef const unsigned char[::1] qv
    cdef const unsigned char[::1] kv
    cdef int t
    if dtype not in ("f32", "f16", "bf16"):
        qv = np.concatenate([quantize(row, "q8_0") for row in x2])
        A.q = <const cb_block_q8_0 *>&qv[0]
    fixes = np.zeros((n_tok, cols // 32), dtype=np.float32)
    cdef float[:, ::1] fv = fixes
    if q8_1_min and A.q != NULL:
        for t in range(n_tok):
            cb_q8_1_fixes(&xv[t, 0], A.q + t * A.q_stride, cols, &fv[t, 0])
        A.q8_1_fix = &fv[0, 0]
    if cols % 256 == 0 and dtype not in ("f32", "f16", "bf16"):
        kv = np.concatenate([quantize(row, "q8_k") for row in x2])
        A.k = <const cb_block_q8_k *>&kv[0]
    cb_matmul_tile(&W, r0, rows if r1 < 0 else r1, &A, NULL, n_tok, &ov[0, 0], rows, NULL, CB_SET, NULL)
    return out


def topk(values, int k):
    """The router's top-k: indices, highest first, ties to the lower index."""
    cdef const float[::1] v = _f32(values).ravel()
    out = np.empty(k, dtype=np.int32)
    cdef int32_t[::1] ov = out
    cb_topk(&v[0], v.shape[0], k, &ov[0])
    return out


def rmsnorm(x, w, float eps):
    cdef const float[::1] xv = _f32(x).ravel()
    cdef const float[::1] wv = _f32(w).ravel()
    out = np.empty(xv.shape[0], dtype=np.float32)
    cdef float[::1] ov = out
    cb_rmsnorm(&ov[0], &xv[0], &wv[0], xv.shape[0], eps)
    return out


def rope(x, int n_heads, int head_dim, cos_pos, sin_pos):
    """x [n_heads * head_dim] rotated by one position's cos/sin [head_dim/2]."""
    out = _f32(x).ravel().copy()
    cdef float[::1] ov = out
    cdef const float[::1] cv = _f32(cos_pos).ravel()
    cdef const float[::1] sv = _f32(sin_pos).ravel()
    cb_rope_neox(&ov[0], n_heads, head_dim, &cv[0], &sv[0])
    return out


def softmax(x):
    out = _f32(x).ravel().copy()
    cdef float[::1] ov = out
    cb_softmax(&ov[0], ov.shape[0])
    return out
