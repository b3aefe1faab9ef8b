"""Offline model kit: widening keeps logits, truncation, perturbation, distillation, SmolLM2.

Everything runs on CPU in float32. The tiny-model tests take seconds; the
SmolLM2 tests build the real 135M model from its packaged GGUF file.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from faser_sglang.kit import drafts
from faser_sglang.kit.drafts import (
    default_prompts,
    distill,
    load_tensors,
    perturb,
    read_manifest,
    shape_twins,
    truncate_layers,
    widen,
)
from faser_sglang.kit.presets import PRESETS, WideShape
from faser_sglang.kit.presets import main as presets_main
from faser_sglang.kit.smollm2 import build_smollm2, gguf_path
from faser_sglang.kit.tiny import build_tiny_llama


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Run this module's small models on one intra-op thread.

    They gain nothing from more, and on a busy machine every multi-threaded
    op waits at a barrier for descheduled threads: the distillation test took
    116 s with two threads and 1 s with one on the same loaded host.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(model_dir: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)


def _random_ids(vocab_size: int, seed: int = 0, shape: tuple[int, int] = (3, 48)) -> torch.Tensor:
    return torch.randint(vocab_size, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _logits(model_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    return _model(model_dir)(ids).logits


# --------------------------------------------------------------------------
# Widening and ballast
# --------------------------------------------------------------------------


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (8, 4)])
def test_widen_with_ballast_keeps_logits(tmp_path, num_heads, num_kv_heads):
    src = build_tiny_llama(tmp_path / "src", seed=1)  # hidden 64, 4 q / 2 kv heads, 2 layers
    out = widen(
        src, tmp_path / "wide", 128, 256, num_heads, num_kv_heads, ballast_layers=2, dtype=torch.float32
    )

    config = LlamaConfig.from_pretrained(str(out))
    assert (config.hidden_size, config.intermediate_size) == (128, 256)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        num_heads,
        num_kv_heads,
        16,
    )
    assert config.num_hidden_layers == 4
    tensors = load_tensors(out)
    assert tensors["model.embed_tokens.weight"].shape == (config.vocab_size, 128)
    assert tensors["lm_head.weight"].shape == (config.vocab_size, 128)
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (num_heads * 16, 128)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (num_kv_heads * 16, 128)
    assert tensors["model.layers.0.mlp.gate_proj.weight"].shape == (256, 128)
    for ballast in (2, 3):
        prefix = f"model.layers.{ballast}."
        assert not tensors[prefix + "self_attn.o_proj.weight"].any()
        assert not tensors[prefix + "mlp.down_proj.weight"].any()
        assert tensors[prefix + "self_attn.q_proj.weight"].std() > 0  # random: real compute

    ids = _random_ids(config.vocab_size)
    torch.testing.assert_close(_logits(out, ids), _logits(src, ids), atol=1e-4, rtol=1e-4)

    again = widen(
        src, tmp_path / "again", 128, 256, num_heads, num_kv_heads, ballast_layers=2, dtype=torch.float32
    )
    assert all(torch.equal(t, load_tensors(again)[name]) for name, t in tensors.items())


def test_shape_twins_take_the_widths_without_the_depth(tmp_path):
    """Twins of a pair: its target's and draft's widths and heads, the tiny source's two
    layers (no ballast), in bfloat16 as the pair is served; a second call keeps them.
    (That widening keeps the logits is test_widen_with_ballast_keeps_logits's.)"""
    src = build_tiny_llama(tmp_path / "src", seed=1)  # hidden 64, 4 q / 2 kv heads, 2 layers
    target, draft = WideShape(128, 256, 8, 2, ballast_layers=5), WideShape(96, 192, 6, 2, ballast_layers=1)
    twins = shape_twins(src, tmp_path / "twins", target, draft)
    assert twins == {"target": tmp_path / "twins" / "target", "draft": tmp_path / "twins" / "draft"}
    for role, shape in (("target", target), ("draft", draft)):
        config = LlamaConfig.from_pretrained(str(twins[role]))
        assert (config.hidden_size, config.intermediate_size) == (shape.hidden_size, shape.intermediate_size)
        assert (config.num_attention_heads, config.num_key_value_heads) == (shape.num_heads, shape.num_kv_heads)
        assert config.num_hidden_layers == 2
        assert load_tensors(twins[role])["model.embed_tokens.weight"].dtype == torch.bfloat16
    stamp = (twins["draft"] / "kit.json").stat().st_mtime_ns
    shape_twins(src, tmp_path / "twins", target, draft)
    assert (twins["draft"] / "kit.json").stat().st_mtime_ns == stamp


def test_shape_twins_at_full_depth_take_the_pairs_layer_counts(tmp_path):
    """With ``depths``, ballast makes up each twin's depth; a source deeper than the
    pair is refused."""
    src = build_tiny_llama(tmp_path / "src", seed=1)  # 2 layers
    target, draft = WideShape(128, 256, 8, 2, ballast_layers=0), WideShape(96, 192, 6, 2, ballast_layers=0)
    twins = shape_twins(src, tmp_path / "twins", target, draft, depths=(5, 3))
    assert [LlamaConfig.from_pretrained(str(twins[r])).num_hidden_layers for r in ("target", "draft")] == [5, 3]
    with pytest.raises(ValueError, match="more than the pair's"):
        shape_twins(src, tmp_path / "shallow", target, draft, depths=(5, 1))


def test_preset_depths_count_the_ballast():
    assert PRESETS["cost-faithful-14b"].depths() == (48, 24)
    assert PRESETS["cpu"].depths() == (30, 8)


def test_sharded_checkpoint_loads(tmp_path, monkeypatch):
    # Small shards exercise the multi-file layout a 7B-class target gets.
    monkeypatch.setattr(drafts, "MAX_SHARD_BYTES", 256 << 10)
    src = build_tiny_llama(tmp_path / "src", seed=1)
    out = widen(src, tmp_path / "wide", 128, 256, 8, 2, ballast_layers=1, dtype=torch.float32)

    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert (out / "model.safetensors.index.json").is_file()
    ids = _random_ids(LlamaConfig.from_pretrained(str(src)).vocab_size)
    torch.testing.assert_close(_logits(out, ids), _logits(src, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "hidden,heads,kv_heads",
    [
        (128, 8, 8),  # groups of 1 cannot hold the source's groups of 2
        (128, 8, 1),  # fewer kv heads than the source's 2
        (32, 4, 2),  # narrower than the source
    ],
)
def test_widen_rejects_shapes_that_cannot_embed(tmp_path, hidden, heads, kv_heads):
    src = build_tiny_llama(tmp_path / "src", seed=1)
    with pytest.raises(ValueError, match="cannot widen"):
        widen(src, tmp_path / "wide", hidden, 256, heads, kv_heads, dtype=torch.float32)


# --------------------------------------------------------------------------
# Truncation and perturbation
# --------------------------------------------------------------------------


def test_truncate_keeps_first_layers_exactly(tmp_path):
    src = build_tiny_llama(tmp_path / "src", seed=1, num_layers=4)
    out = truncate_layers(src, tmp_path / "short", 2)

    source, short = load_tensors(src), load_tensors(out)
    expected = {name for name in source if not name.startswith(("model.layers.2.", "model.layers.3."))}
    assert set(short) == expected
    assert all(torch.equal(short[name], source[name]) for name in expected)
    assert LlamaConfig.from_pretrained(str(out)).num_hidden_layers == 2
    assert (
        AutoTokenizer.from_pretrained(str(out)).get_vocab()
        == AutoTokenizer.from_pretrained(str(src)).get_vocab()
    )

    # The truncated model is the source exiting after layer 2 through the same norm and head.
    ids = _random_ids(len(source["lm_head.weight"]))
    full = _model(src)
    with torch.no_grad():
        hidden = full(ids, output_hidden_states=True).hidden_states[2]
        early_exit = full.lm_head(full.model.norm(hidden))
    torch.testing.assert_close(_logits(out, ids), early_exit, atol=1e-5, rtol=1e-5)


def test_perturb_adds_requested_relative_noise(tmp_path):
    src = build_tiny_llama(tmp_path / "src", seed=1)
    out = perturb(src, tmp_path / "noisy", noise=0.05, seed=3)

    source, noisy = load_tensors(src), load_tensors(out)
    assert set(noisy) == set(source)
    for name, weight in source.items():
        delta = noisy[name] - weight
        if weight.std() == 0:  # all-ones norms have no spread to scale noise by
            assert not delta.any()
        else:
            assert delta.std() / weight.std() == pytest.approx(0.05, rel=0.1), name
    again = load_tensors(perturb(src, tmp_path / "again", noise=0.05, seed=3))
    assert all(torch.equal(t, again[name]) for name, t in noisy.items())


# --------------------------------------------------------------------------
# Distillation
# --------------------------------------------------------------------------


def test_distill_on_cpu_raises_agreement(tmp_path):
    target = build_tiny_llama(tmp_path / "target", seed=1)
    draft = perturb(target, tmp_path / "draft", noise=0.2, seed=2)
    prompts = default_prompts(AutoTokenizer.from_pretrained(str(target)), num_code=112)
    kwargs = dict(steps=30, seq_len=32, batch_size=8, lr=3e-3, seed=0, device="cpu", prompts=prompts)

    result = distill(target, draft, tmp_path / "distilled", **kwargs)

    assert 0.0 <= result.agreement_before < result.agreement_after <= 1.0
    assert result.held_out_positions > 0
    assert list(result.agreement_by_position) == ["0-127"]  # seq_len 32: one bucket
    assert result.agreement_by_position["0-127"] == pytest.approx(result.agreement_after)
    assert read_manifest(tmp_path / "distilled")["metrics"]["agreement_after"] == result.agreement_after
    assert load_tensors(tmp_path / "distilled").keys() == load_tensors(draft).keys()
    assert distill(target, draft, tmp_path / "distilled", **kwargs) == result  # cached: same recipe


def test_every_other_code_prompt_opens_a_function(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_llama(tmp_path / "target", seed=1)))

    prompts = default_prompts(tokenizer, num_code=40, seed=3)

    code = prompts[:40]
    assert all(p.lstrip().startswith("def ") for p in code[1::2])
    assert sum(p.lstrip().startswith("def ") for p in code[::2]) < 10  # random offsets
    assert 4 <= min(p.count("\n") for p in code) and max(p.count("\n") for p in code) <= 12
    assert default_prompts(tokenizer, num_code=40, seed=3) == prompts


def test_target_continuations_run_past_the_end_token(tmp_path):
    """As a server's under ignore_eos: an end token in the greedy path neither stops the
    continuation nor is suppressed."""
    model_dir = build_tiny_llama(tmp_path / "target", seed=1)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompt = "def add(a, b):"
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    greedy = model.generate(ids, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generation_config.eos_token_id = int(greedy[0, ids.shape[1]])  # the first new token ends

    n = ids.shape[1]

    data = drafts._generate(model, tokenizer, [prompt], seq_len=2 * n, batch=4)  # keeps n prompt tokens

    assert data.tokens.shape == (1, 2 * n)
    assert data.tokens[0, n] == model.generation_config.eos_token_id
    assert data.continuation[0].sum() == n


def test_agreement_of_drafts_on_any_prompts(tmp_path):
    target = build_tiny_llama(tmp_path / "target", seed=1)
    noisy = perturb(target, tmp_path / "noisy", noise=0.5, seed=2)
    prompts = default_prompts(AutoTokenizer.from_pretrained(str(target)), num_code=6)[:6]

    found = drafts.agreement(target, {"same": target, "noisy": noisy}, prompts, seq_len=24, device="cpu")

    assert found["same"] == {"all": 1.0, "by_position": {"0-127": 1.0}}
    assert 0.0 <= found["noisy"]["all"] < 1.0


def test_agreement_by_position_splits_at_bucket_edges():
    total = torch.zeros(300, dtype=torch.int64)
    agree = torch.zeros(300, dtype=torch.int64)
    total[120:136] = 1  # 8 positions in each of the first two buckets
    agree[120:124] = 1  # 4 of 8 agree below 128
    agree[128:136] = 1  # 8 of 8 from 128; nothing past 255 is a continuation

    by_position = drafts._Agreement(agree, total).by_position()

    assert by_position == {"0-127": 0.5, "128-255": 1.0}
    assert drafts._Agreement(agree, total).overall() == 12 / 16


# --------------------------------------------------------------------------
# SmolLM2
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    try:
        gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return build_smollm2(tmp_path_factory.mktemp("smollm2") / "model", dtype=torch.float32)


def test_smollm2_checkpoint_writes_code(smollm2):
    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    config = LlamaConfig.from_pretrained(str(smollm2))
    assert (config.num_hidden_layers, config.hidden_size, config.eos_token_id) == (30, 576, 2)

    inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
    output = _model(smollm2).generate(**inputs, max_new_tokens=24, do_sample=False)
    continuation = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
    assert "return" in continuation and "fibonacci" in continuation, continuation

    weights = smollm2 / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    assert build_smollm2(smollm2, dtype=torch.float32) == smollm2
    assert weights.stat().st_mtime_ns == mtime  # complete build reused


def test_smollm2_widened_keeps_top1(smollm2, tmp_path):
    wide = widen(smollm2, tmp_path / "wide", 1024, 2048, 16, 4, ballast_layers=1, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(wide))
    ids = tokenizer("import numpy as np\n\ndef moving_average(x, k):\n", return_tensors="pt")["input_ids"]

    small, large = _logits(smollm2, ids), _logits(wide, ids)
    assert torch.equal(large.argmax(-1), small.argmax(-1))
    torch.testing.assert_close(large, small, atol=2e-3, rtol=1e-4)


# SmolLM2-135M's shape (the source of every GPU preset): 30 layers, 9 q / 3 kv heads of 64.
SMOLLM2_SHAPE = drafts.LlamaShape(hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64)


@pytest.mark.parametrize(
    "name, target_params, draft_params",
    [("cost-faithful", 7_180_914_688, 415_286_272), ("cost-faithful-14b", 13_464_212_480, 415_286_272)],
)
def test_gpu_presets_embed_smollm2_at_their_documented_sizes(name, target_params, draft_params):
    preset = PRESETS[name]
    pairs = ((preset.target, 30, target_params), (preset.draft, preset.draft_layers, draft_params))
    for shape, real_layers, params in pairs:
        dst = drafts.LlamaShape(shape.hidden_size, shape.intermediate_size, shape.num_heads, shape.num_kv_heads, 64)
        drafts.check_widening(SMOLLM2_SHAPE, dst)
        config = LlamaConfig(
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_attention_heads=shape.num_heads,
            num_key_value_heads=shape.num_kv_heads,
            head_dim=64,
            num_hidden_layers=real_layers + shape.ballast_layers,
            vocab_size=49152,
            tie_word_embeddings=True,
        )
        assert drafts.count_parameters(config) == params
    assert preset.draft.ballast_layers + preset.draft_layers == 24  # shaped like Qwen2.5-0.5B


def test_presets_command_prints_shell_ready_values(capsys):
    assert presets_main(["cost-faithful-14b", "target"]) == 0
    assert capsys.readouterr().out.split() == "--hidden 5120 --intermediate 13824 --heads 80 --kv-heads 16".split()
    assert presets_main(["cost-faithful", "max-total-tokens"]) == 0
    assert capsys.readouterr().out.strip() == "400000"
    assert presets_main(["cpu", "target"]) == 1  # the CPU pair is not widened
    assert presets_main(["no-such-preset", "target"]) == 2 and "usage" in capsys.readouterr().err
