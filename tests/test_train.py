"""posym.core.train: schedule, loss, evaluation, run directory, exact resume, CLI errors, learning."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import load_file, save_file
from transformers import get_linear_schedule_with_warmup

from posym import cli, io
from posym.cli.options import Preset
from posym.commands.train import (
    LEGACY_DEFAULTS,
    LEGACY_MODEL_DEFAULTS,
    TRAINER_TENSORS,
    resolve_config,
    run_hash,
    train,
)
from posym.configs import to_dict
from posym.core.model import ModelConfig, build_model
from posym.core.tasks import SPLIT_SIZES, generate, task_config
from posym.core.train import (
    PRESETS,
    TrainConfig,
    checkpoint_steps,
    evaluate,
    last_logits,
    lr_factor,
    train_batch,
)
from posym.errors import PosymError
from posym.models import list_checkpoints, load_checkpoint, read_checkpoint_meta

SMALL_TASK = dict(target_size=4, pretarget_size=3, max_hops=2, alphabet_size=4, int_range=7)


def tiny(**kw) -> TrainConfig:
    """A 2-layer model with dropout on a 2-hop task: seconds per run, and dropout makes RNG matter."""
    base = dict(
        preset="test",
        task=task_config("number", **SMALL_TASK),
        model=ModelConfig(n_layer=2, n_head=1, n_embd=32, dropout=0.1),
        lr=3e-3,
        warmup_steps=3,
        max_steps=12,
        batch_size=8,
        checkpoint_every=4,
        eval_size=24,
        eval_batch_size=10,
        threads=1,
        device="cpu",
    )
    return TrainConfig(**{**base, **kw})


def weights(checkpoint) -> dict:
    return load_file(str(checkpoint / "model.safetensors"))


def assert_same_weights(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.allclose(wa[key], wb[key], atol=1e-6, rtol=0), key


# ---- pure pieces against references -------------------------------------------------------------


def test_lr_schedule_matches_transformers():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=7, num_training_steps=30)
    for step in range(30):
        assert lr_factor(step, 7, 30) == pytest.approx(opt.param_groups[0]["lr"], abs=1e-12)
        opt.step()
        sched.step()


def test_checkpoint_steps():
    assert checkpoint_steps(1200, 500) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 500, 1000, 1200]
    assert checkpoint_steps(3, 4) == [0, 1, 2, 3]


def test_last_position_loss_equals_hf_labels_loss():
    model = build_model(ModelConfig(n_layer=2, n_head=2, n_embd=32, dropout=0.0), 20, 0)
    ids = torch.randint(1, 20, (5, 9))  # [batch, seq]
    answer = torch.randint(1, 20, (5,))  # [batch]
    fast = F.cross_entropy(last_logits(model, ids), answer)
    # Reference: the answer appended as the 10th token, labels -100 everywhere but there.
    full = torch.cat([ids, answer[:, None]], dim=1)
    labels = torch.full_like(full, -100)
    labels[:, -1] = answer
    slow = model(full, labels=labels).loss
    assert torch.allclose(fast, slow, atol=1e-6)


def test_evaluate_matches_a_per_sample_loop():
    cfg = task_config("number", **SMALL_TASK)
    model = build_model(ModelConfig(n_layer=1, n_head=1, n_embd=16), cfg.vocab_size, 0)
    model.train()
    got = evaluate(model, cfg, 40, seed=5, batch_size=7)
    assert model.training  # mode restored
    s = generate(cfg, 40, 5, split="test")
    model.eval()
    hits, losses = [], []
    for i in range(40):
        logits = model(torch.as_tensor(s.input_ids[i : i + 1])).logits[0, -1]  # [vocab]
        hits.append(float(logits.argmax().item() == s.answer[i]))
        losses.append(F.cross_entropy(logits[None], torch.as_tensor(s.answer[i : i + 1])).item())
    assert got["acc"] == pytest.approx(sum(hits) / 40)
    assert got["loss"] == pytest.approx(sum(losses) / 40, abs=1e-5)
    for h in (1, 2):
        mine = [x for x, hop in zip(hits, s.hops) if hop == h]
        assert got[f"acc_hop{h}"] == pytest.approx(sum(mine) / len(mine))


def test_train_batch_wraps_around_the_split():
    cfg = task_config("number", **SMALL_TASK)
    n = SPLIT_SIZES["train"]
    step = n // 10 - 1  # batch of 10 samples [n-10, n); the next one starts at 0 again
    ids, answer = train_batch(cfg, step, 10, 3)
    assert (ids == generate(cfg, 10, 3, "train", start=n - 10).input_ids).all()
    ids, answer = train_batch(cfg, n // 7, 7, 3)  # starts at (n//7)*7 % n, crosses the end
    start = (n // 7) * 7 % n
    ref = (
        generate(cfg, n - start, 3, "train", start=start).input_ids.tolist()
        + generate(cfg, 7 - (n - start), 3, "train").input_ids.tolist()
    )
    assert ids.tolist() == ref and len(answer) == 7


def test_presets_and_overrides(tmp_path):
    paper = resolve_config("paper", "number")
    assert (paper.lr, paper.betas, paper.weight_decay, paper.warmup_steps) == (1e-4, [0.95, 0.999], 1e-4, 750)
    assert (paper.batch_size, paper.max_steps, paper.checkpoint_every) == (192, 6000, 500)
    assert resolve_config("seed", "letter").model.n_head == 8
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.003\nmodel: {n_layer: 3}\ntask: {max_hops: 2}\n")
    cfg = resolve_config("quick", "letter", path, {"seed": 7})
    assert (cfg.lr, cfg.model.n_layer, cfg.model.n_embd, cfg.task.max_hops, cfg.seed) == (0.003, 3, 64, 2, 7)
    path.write_text("lr: 0.003\nlearning_rate: 1\n")
    with pytest.raises(PosymError, match="learning_rate"):
        resolve_config("quick", "number", path)
    with pytest.raises(PosymError, match="max_hops=12 needs 11 distinct intermediate positions"):
        resolve_config("quick", "number", overrides={"task": {"max_hops": 12}})  # impossible task
    with pytest.raises(PosymError, match="unknown preset"):
        resolve_config("huge", "number")


def test_the_authors_preset_is_the_paper_preset_with_embedding_dropout_0():
    """docs/method.md section 6: the only difference the released code makes effective is embd_pdrop 0."""
    paper, authors = to_dict(resolve_config("paper", "letter")), to_dict(resolve_config("authors", "letter"))
    assert authors.pop("preset") == "authors" and paper.pop("preset") == "paper"
    assert authors["model"].pop("embd_dropout") == 0.0 and paper["model"].pop("embd_dropout") is None
    assert authors == paper
    assert {p.value for p in Preset} == set(PRESETS)  # the CLI offers every preset the code has


def test_dropout_fields_left_at_none_keep_the_hash_of_runs_from_before_they_existed():
    cfg = tiny()
    data = {k: v for k, v in to_dict(cfg).items() if LEGACY_DEFAULTS.get(k, ...) != v}
    for name in ("embd_dropout", "resid_dropout", "attn_dropout"):
        del data["model"][name]
    assert run_hash(cfg) == io.config_hash(data)  # what the code of that time wrote
    assert run_hash(tiny(model=ModelConfig(n_layer=2, n_head=1, n_embd=32, embd_dropout=0.0))) != run_hash(cfg)


# ---- the run directory and exact resume ---------------------------------------------------------


def test_run_directory_layout_and_plain_reload(tmp_path):
    cfg = tiny()
    run = train(cfg, tmp_path / "run", progress=False)
    assert {p.name for p in run.iterdir()} == {
        "config.yaml",
        "manifest.json",
        "metrics.parquet",
        "train.log",
        "checkpoints",
    }
    assert yaml.safe_load((run / "config.yaml").read_text()) == to_dict(cfg)
    steps = [s for s, _ in list_checkpoints(run)]
    assert steps == [0, 1, 2, 4, 8, 12]
    metrics = pd.read_parquet(run / "metrics.parquet")
    assert list(metrics.step) == steps
    assert {"step", "loss", "acc", "acc_hop1", "acc_hop2", "train_loss"} <= set(metrics.columns)
    # only the latest checkpoint keeps the optimizer/RNG state
    assert [s for s, p in list_checkpoints(run) if (p / TRAINER_TENSORS).exists()] == [12]
    model, info = load_checkpoint(run)
    assert info["step"] == 12 and info["task_config"] == cfg.task and info["model_config"] == cfg.model
    assert info["metrics"]["acc"] == metrics.acc.iloc[-1]
    from transformers import GPTJForCausalLM

    plain = GPTJForCausalLM.from_pretrained(info["path"], attn_implementation="eager").eval()
    ids = torch.as_tensor(generate(cfg.task, 6, 0, "test").input_ids)
    assert torch.equal(plain(ids).logits, model(ids).logits)
    # same seed, same numbers
    again = train(cfg, tmp_path / "again", progress=False)
    assert_same_weights(list_checkpoints(run)[-1][1], list_checkpoints(again)[-1][1])
    with pytest.raises(PosymError, match="already exists"):
        train(cfg, run, progress=False)


def test_resume_after_a_checkpoint_is_exact(tmp_path):
    cfg = tiny(keep_trainer_state=True)
    full = train(cfg, tmp_path / "full", progress=False)
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    for step, path in list_checkpoints(cut):
        if step > 4:
            shutil.rmtree(path)  # as if killed right after the step-4 checkpoint
    train(None, cut, resume=True, progress=False)
    assert_same_weights(list_checkpoints(full)[-1][1], list_checkpoints(cut)[-1][1])
    a = pd.read_parquet(full / "metrics.parquet").drop(columns="time")
    b = pd.read_parquet(cut / "metrics.parquet").drop(columns="time")
    pd.testing.assert_frame_equal(a, b)
    # the test can fail: resuming with another dropout RNG state ends with other weights
    other = tmp_path / "other"
    shutil.copytree(full, other)
    for step, path in list_checkpoints(other):
        if step > 4:
            shutil.rmtree(path)
    state_file = list_checkpoints(other)[-1][1] / TRAINER_TENSORS
    state = load_file(str(state_file))
    state["rng.torch"] = torch.Generator().manual_seed(99).get_state()
    save_file(state, str(state_file))
    train(None, other, resume=True, progress=False)
    with pytest.raises(AssertionError):
        assert_same_weights(list_checkpoints(full)[-1][1], list_checkpoints(other)[-1][1])
    with pytest.raises(PosymError, match="different config"):
        train(tiny(seed=1), cut, resume=True, progress=False)


def test_stop_at_keeps_the_schedule_and_resume_finishes_the_same_run(tmp_path):
    cfg = tiny()
    full = train(cfg, tmp_path / "full", progress=False)
    piece = train(cfg, tmp_path / "piece", progress=False, stop_at=6)  # 6 is not a regular checkpoint
    assert [s for s, _ in list_checkpoints(piece)] == [0, 1, 2, 4, 6]
    assert yaml.safe_load((piece / "config.yaml").read_text())["max_steps"] == 12  # the schedule is untouched
    with pytest.raises(PosymError, match="already at step 6"):
        train(None, piece, resume=True, progress=False, stop_at=5)
    assert cli_exit(["train", "--resume", str(piece), "--stop-at", "10", "--no-progress"]) == 0
    assert [s for s, _ in list_checkpoints(piece)] == [0, 1, 2, 4, 6, 8, 10]
    train(None, piece, resume=True, progress=False)
    assert_same_weights(list_checkpoints(full)[-1][1], list_checkpoints(piece)[-1][1])
    shorter = train(tiny(max_steps=6), tmp_path / "shorter", progress=False)  # --steps 6 decays the lr sooner
    with pytest.raises(AssertionError):
        assert_same_weights(list_checkpoints(piece)[4][1], list_checkpoints(shorter)[-1][1])
    with pytest.raises(PosymError, match="positive step"):
        train(cfg, tmp_path / "never", progress=False, stop_at=0)
    assert not (tmp_path / "never").exists()


def test_a_run_from_another_machine_is_finished_here_with_device_and_threads(tmp_path, capsys):
    """A run whose config names a GPU and more threads than this machine has (started on the GPU machine)
    is refused with the way out, then finished here with --device cpu --threads 1: the run's config
    untouched, the change in train.log, the weights of an uninterrupted run on this machine."""
    cfg = tiny()
    full = train(cfg, tmp_path / "full", progress=False)
    run = train(cfg, tmp_path / "moved", progress=False, stop_at=6)
    elsewhere = {
        **yaml.safe_load((run / "config.yaml").read_text()),
        "device": "cuda",
        "threads": (os.cpu_count() or 1) + 1,
    }
    (run / "config.yaml").write_text(yaml.safe_dump(elsewhere))
    capsys.readouterr()
    assert cli_exit(["train", "--resume", str(run), "--device", "cpu", "--no-progress"]) == 2
    assert "more than this machine's" in capsys.readouterr().err  # the threads still refused
    if not torch.cuda.is_available():
        assert cli_exit(["train", "--resume", str(run), "--threads", "1", "--no-progress"]) == 2
        assert "pass --device and/or --threads" in capsys.readouterr().err
    assert [s for s, _ in list_checkpoints(run)][-1] == 6  # refusals touched nothing
    assert cli_exit(["train", "--resume", str(run), "--device", "cpu", "--threads", "1", "--no-progress"]) == 0
    assert yaml.safe_load((run / "config.yaml").read_text()) == elsewhere
    log = (run / "train.log").read_text()
    assert f"continuing on cpu with 1 threads (the run's config names cuda with {elsewhere['threads']} threads)" in log
    assert_same_weights(list_checkpoints(full)[-1][1], list_checkpoints(run)[-1][1])
    with pytest.raises(PosymError, match="overrides are for resuming"):
        train(cfg, tmp_path / "new", progress=False, device="cpu")
    assert not (tmp_path / "new").exists()


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    cfg = tiny(max_steps=80, checkpoint_every=8)
    data = to_dict(cfg)
    data.pop("preset")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data))
    run = tmp_path / "killed"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "posym.cli",
            "train",
            "--preset",
            "quick",
            "--task",
            "number",
            "--config",
            str(tmp_path / "tiny.yaml"),
            "--out",
            str(run),
            "--no-progress",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    while not (run / "checkpoints" / "step-00000008").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # somewhere in the steps after 8, maybe inside a checkpoint write
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = [s for s, _ in list_checkpoints(run)]
    assert 8 in done and 80 not in done, f"kill came at a bad moment: {done}"
    for _, path in list_checkpoints(run):  # every visible checkpoint is complete
        load_checkpoint(path)
    assert cli_exit(["train", "--resume", str(run), "--no-progress"]) == 0
    reference = train(resolve_config("quick", "number", tmp_path / "tiny.yaml"), tmp_path / "ref", progress=False)
    assert_same_weights(list_checkpoints(reference)[-1][1], list_checkpoints(run)[-1][1])
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # leftovers removed


def test_a_config_yaml_from_before_val_size_and_precision_resumes_unchanged(tmp_path):
    """Runs started before val_size/precision existed (the lead's paper runs) keep their hash and
    resume to the very weights of an uninterrupted run, recording no validation columns."""
    cfg = tiny()
    full = train(cfg, tmp_path / "full", progress=False)
    old = tmp_path / "old"
    train(cfg, old, progress=False, stop_at=6)
    data = yaml.safe_load((old / "config.yaml").read_text())
    del data["val_size"], data["precision"]
    for name in LEGACY_MODEL_DEFAULTS:  # and the per-site dropouts, newer still
        del data["model"][name]
    (old / "config.yaml").write_text(yaml.safe_dump(data))
    legacy_hash = io.config_hash(data)  # what the code of that time wrote
    assert json.loads((old / "manifest.json").read_text())["config_hash"] == legacy_hash
    train(None, old, resume=True, progress=False)
    assert_same_weights(list_checkpoints(full)[-1][1], list_checkpoints(old)[-1][1])
    assert {read_checkpoint_meta(p)["config_hash"] for _, p in list_checkpoints(old)} == {legacy_hash}
    assert not any(c.startswith("val_") for c in pd.read_parquet(old / "metrics.parquet").columns)
    assert run_hash(tiny(val_size=5)) != legacy_hash and run_hash(tiny(precision="bf16")) != legacy_hash


def test_the_first_precision_spellings_read_as_torch_names_and_keep_the_hash(tmp_path):
    """config.yaml files of runs from before the precision took torch's names (fp32, bf16) load as
    float32 / bfloat16, and a run's hash is what the code of that time wrote, in either spelling."""
    from posym.configs import from_dict
    from posym.core.train import LEGACY_PRECISIONS, PRECISIONS

    assert set(LEGACY_PRECISIONS.values()) == set(PRECISIONS)
    for old, new in LEGACY_PRECISIONS.items():
        data = to_dict(tiny())
        data["precision"] = old
        assert from_dict(TrainConfig, data).precision == new
        assert run_hash(tiny(precision=old)) == run_hash(tiny(precision=new))
    # the hash the earlier code wrote: fp32 left out (a legacy default), bf16 hashed as "bf16"
    earlier = {k: v for k, v in to_dict(tiny()).items() if k not in ("precision",) and LEGACY_DEFAULTS.get(k, ...) != v}
    for name in LEGACY_MODEL_DEFAULTS:
        del earlier["model"][name]
    assert run_hash(tiny(precision="float32")) == io.config_hash(earlier)
    assert run_hash(tiny(precision="bfloat16")) == io.config_hash({**earlier, "precision": "bf16"})
    with pytest.raises(PosymError, match="precision"):
        from_dict(TrainConfig, {**to_dict(tiny()), "precision": "float16"})


def test_validation_accuracy_is_recorded_at_every_checkpoint(tmp_path):
    cfg = tiny(val_size=30)
    run = train(cfg, tmp_path / "run", progress=False)
    metrics = pd.read_parquet(run / "metrics.parquet")
    model, _ = load_checkpoint(run)
    direct = evaluate(model, cfg.task, 30, cfg.seed, "val", 7)
    last = metrics.iloc[-1]
    assert last.val_acc == pytest.approx(direct["acc"], abs=1e-12)
    assert last.val_loss == pytest.approx(direct["loss"], abs=1e-5) and last.val_n == 30
    assert metrics.val_acc.notna().all()
    with pytest.raises(PosymError, match="val_size"):
        tiny(val_size=SPLIT_SIZES["val"] + 1)


def test_bf16_autocast_trains_close_to_fp32_but_not_identically(tmp_path):
    """bf16 changes the numbers (so autocast is really on) by little, and the weights stay fp32."""
    runs = {p: train(tiny(precision=p), tmp_path / p, progress=False) for p in ("float32", "bfloat16")}
    w32, w16 = (weights(list_checkpoints(runs[p])[-1][1]) for p in ("float32", "bfloat16"))
    assert all(w.dtype == torch.float32 for w in w16.values())
    differences = [(w32[k] - w16[k]).abs().max().item() for k in w32]
    assert 0 < max(differences) < 5e-3  # lr 3e-3 x 12 steps moves a weight by up to ~4e-2
    loss = {p: pd.read_parquet(runs[p] / "metrics.parquet").train_loss.iloc[-1] for p in runs}
    assert loss["bfloat16"] == pytest.approx(loss["float32"], rel=2e-2)
    # the autocast forward itself: bf16 matmuls on the same weights and batch give another loss
    model = build_model(tiny().model, tiny().task.vocab_size, 0).eval()
    ids = torch.as_tensor(generate(tiny().task, 16, 0, "train").input_ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = last_logits(model, ids)
    assert low.dtype == torch.bfloat16
    assert not torch.equal(low.float(), last_logits(model, ids))


# ---- CLI -----------------------------------------------------------------------------------------


def cli_exit(argv, capsys=None) -> int:
    old = sys.argv
    sys.argv = ["posym", *argv]
    try:
        cli.main()
        return 0
    except SystemExit as exc:
        return exc.code
    finally:
        sys.argv = old


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--preset", "huge", "--out", "{tmp}/r"], "'huge' is not one of 'quick', 'seed', 'paper'"),
        (["train", "--config", "{tmp}/bad.yaml", "--out", "{tmp}/r"], "unknown key 'lrr'"),
        (["train", "--task", "words", "--out", "{tmp}/r"], "'words' is not one of 'number', 'letter'"),
        (["train"], "--out"),
        (["train", "--resume", "{tmp}/missing"], "no config.yaml"),
        (["train", "--resume", "{tmp}", "--train-steps", "3"], "drop --train-steps"),
        (["eval", "{tmp}/missing"], "does not exist"),
        (["eval", "{tmp}"], "neither a model"),
    ],
)
def test_cli_errors_are_one_line_exit_2(tmp_path, capsys, argv, message):
    (tmp_path / "bad.yaml").write_text("lrr: 1\n")
    code = cli_exit([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and err.startswith("posym: error:") and "\n" not in err
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_cli_eval_with_extra_target(tmp_path, capsys):
    run = train(tiny(max_steps=2), tmp_path / "run", progress=False)
    out = tmp_path / "eval.json"
    assert (
        cli_exit(["eval", str(run), "--n", "16", "--extra-target", "0", "--extra-target", "5", "--out", str(out)]) == 0
    )
    written = json.loads(out.read_text())
    rows = pd.DataFrame(written["rows"])
    assert list(rows.extra_target) == [0, 5] and list(rows.seq_len) == [8, 13]
    assert written["step"] == 2 and written["queries"] == "last" and written["seed"] == 0  # what was measured
    assert cli_exit(["eval", str(run), "--n", "16", "--extra-target", "0,5", "--out", str(out)]) == 0
    assert pd.DataFrame(json.loads(out.read_text())["rows"]).extra_target.tolist() == [0, 5]  # the comma form
    assert "hop2" in capsys.readouterr().out
    assert cli_exit(["eval", str(run), "--task", "letter"]) == 2  # 129 token ids > the model's 12


# ---- learning ------------------------------------------------------------------------------------


def test_a_tiny_model_learns_a_one_hop_task(tmp_path):
    task = task_config("number", target_size=4, pretarget_size=0, max_hops=1, alphabet_size=4, int_range=4)
    cfg = TrainConfig(
        preset="test",
        task=task,
        model=ModelConfig(n_layer=1, n_head=1, n_embd=32, dropout=0.0),
        lr=1e-2,
        warmup_steps=5,
        max_steps=60,
        batch_size=32,
        checkpoint_every=30,
        eval_size=200,
        threads=1,
        device="cpu",
    )
    metrics = pd.read_parquet(train(cfg, tmp_path / "run", progress=False) / "metrics.parquet")
    assert metrics.acc.iloc[0] < 0.4  # chance is 1/4
    assert metrics.acc.iloc[-1] > 0.9
