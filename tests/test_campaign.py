"""experiments/campaign.py: the plan's order and dependencies, costs from the records, a queue of real tiny cells
that is killed and restarted (the stopped cell resumes from its checkpoint, a recorded cell is never run again),
and the report's guards (one precision per study, test cells at the dev choice)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.test_report import record
from tests.test_train import objective_config

sys.path.insert(0, str(ROOT / "experiments"))
import campaign  # noqa: E402
import dclr_protocol  # noqa: E402
import grid  # noqa: E402
import pages_protocol  # noqa: E402
import records  # noqa: E402
import report  # noqa: E402
import tables  # noqa: E402

M = "model.init_args."


def plan_args(tmp_path) -> argparse.Namespace:
    return argparse.Namespace(data=str(tmp_path / "data"), threads=1, records=tmp_path / "records",
                              out=tmp_path / "out")


def write(root, study, cell, seed, avg=None, wall=100.0, dev=(80.0, 70.0), overrides=(), steps=300, precision="32"):
    r = record(study, cell, seed, avg, dev=dev)
    r["wall_s"], r["overrides"] = wall, list(overrides)
    r["dev_curve"] = [{"step": 0, "stsb": 1.0, "sickr": 2.0}, {"step": steps, "stsb": 1.0, "sickr": 2.0}]
    r["precision"]["train"] = precision
    records.write(records.path_of(root, study, cell, seed), r)
    return r


def keys(plan, state):
    return [j.key for j in plan.jobs if not state.done(j) and state.ready(j)]


def test_the_plan_waits_for_each_choice_and_for_each_seeds_complementary_model(tmp_path):
    args = plan_args(tmp_path)
    plan = campaign.build_plan(args)
    studies = [j.study for j in plan.jobs]
    # the headline first, its five seeds whole, the two dev searches of one size, nothing cut in the plan
    assert studies.index("protocol_simcse_dev") == 0 and max(
        i for i, s in enumerate(studies) if s.startswith("protocol_dclr")) < studies.index("objectives_dev_nli_softmax")
    assert sorted(j.seed for j in plan.jobs if j.study == "protocol_dclr") == [42, 43, 44, 45, 46]
    assert sorted(j.seed for j in plan.jobs if j.study == "protocol_simcse") == [42, 43, 44, 45, 46]
    simcse_dev = [j for j in plan.jobs if j.study == "protocol_simcse_dev"]
    dclr_dev = [j for j in plan.jobs if j.study.startswith("protocol_dclr_dev")]
    assert len(simcse_dev) == len(dclr_dev) == dclr_protocol.BUDGET
    assert not set(studies) & set(campaign.CUT)

    state = campaign.State(plan, args.records)
    ready = keys(plan, state)
    assert all(k.startswith("protocol_simcse_dev/") for k in ready[:9]) and "protocol_simcse/base/seed42" not in ready
    assert not any(k.startswith("objectives_nli_softmax/") for k in ready)  # its dev grid has no record yet

    # SimCSE's dev grid lands: its five seeds are ready, DCLR's search still waits for the seed-42 SimCSE
    for j in simcse_dev:
        write(args.records, j.study, j.label, 42, dev=(82.0, 78.0) if "token_shuffle,lr=3e-5" in j.label else (80, 70),
              overrides=[f"{k}={v}" for k, v in zip((f"{M}augmentation", f"{M}lr"), j.label.replace(
                  "augmentation=", "").replace("lr=", "").split(","))])
    state = campaign.State(plan, args.records)
    ready = keys(plan, state)
    assert [k for k in ready if k.startswith("protocol_simcse/")] == [f"protocol_simcse/base/seed{s}" for s in
                                                                       campaign.SEEDS]
    assert not any(k.startswith("protocol_dclr") for k in ready)
    # the chosen view and learning rate are in the arm's command, built only now
    command = next(j for j in plan.jobs if j.study == "protocol_simcse").command()
    assert f"{M}augmentation=token_shuffle" in command and f"{M}lr=3e-5" in command

    write(args.records, "protocol_simcse", "base", 42, avg=75.0)
    # its record alone is not enough: DCLR reads its checkpoint, which the finished cell leaves in its folder
    assert not any(k.startswith("protocol_dclr_dev") for k in keys(plan, campaign.State(plan, args.records)))
    checkpoint = args.out / "protocol_simcse" / "base" / "seed42" / "model.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("")
    state = campaign.State(plan, args.records)
    ready = keys(plan, state)
    assert sum(k.startswith("protocol_dclr_dev") for k in ready) == dclr_protocol.BUDGET
    assert not any(k.startswith("protocol_dclr/") for k in ready)
    for j in dclr_dev:
        write(args.records, j.study, j.label, 42)
    state = campaign.State(plan, args.records)
    # each final DCLR seed waits for the SimCSE of its own seed (its complementary model)
    assert [k for k in keys(plan, state) if k.startswith("protocol_dclr/")] == ["protocol_dclr/base/seed42"]
    final = next(j for j in plan.jobs if j.study == "protocol_dclr").command()
    assert f"{M}complementary_model={args.out}/protocol_simcse/base/seed{{seed}}/model.ckpt" in final
    # objectives' DCLR waits for the objectives' SimCSE of the same seed
    dev = next(j for j in plan.jobs if j.study == "objectives_dev_dclr")
    assert campaign.Need("objectives_simcse_unsup", 42) in dev.needs


def test_plan_costs_come_from_the_records_and_name_their_source(tmp_path, capsys):
    args = plan_args(tmp_path)
    write(args.records, "objectives_dev_mnr", "lr=1e-5", 42, wall=600.0, steps=300)
    plan = campaign.build_plan(args)
    state = campaign.State(plan, args.records)
    cost, source = state.estimate(next(j for j in plan.jobs if j.study == "protocol_simcse_dev"))
    assert cost == pytest.approx(600.0 * campaign.PROTOCOL_STEPS / 300) and "objectives_dev_mnr" in source
    write(args.records, "protocol_simcse_dev", "augmentation=dropout,lr=1e-5", 42, wall=1500.0, steps=415)
    state = campaign.State(plan, args.records)
    cost, source = state.estimate(next(j for j in plan.jobs if j.study == "protocol_simcse"))
    assert cost == pytest.approx(1500.0) and "protocol_simcse_dev" in source
    campaign.print_plan(plan, state, jobs=2)
    out = capsys.readouterr().out
    summary = campaign.summarize(plan, state, 2)
    assert summary.done == 2 and summary.spent_h == pytest.approx(2100.0 / 3600)
    assert out.splitlines()[0].startswith(f"campaign: 2 of {len(plan.jobs)} cells done")
    assert "protocol_simcse/base/seed42" in out and "(waits for protocol_simcse_dev)" in out
    assert "cut, and why" in out and all(study in out for study in campaign.CUT)


DRIVER = """\
import sys
from pathlib import Path
sys.path.insert(0, {experiments!r})
import argparse, campaign
out, records_dir, config, sts = Path({out!r}), Path({records!r}), {config!r}, {sts!r}
def grid(name, *extra):
    return lambda: [sys.executable, {grid!r}, "--name", name, "--config", config, "--sts_dir", sts, "--select",
                    "last", "--threads", "1", "--eval_precision", "32", "--out", str(out), "--records",
                    str(records_dir), *extra]
plan = campaign.Plan()
plan.grid("tiny_dev", "1", grid("tiny_dev", "--vary", "model.init_args.lr=1e-3,2e-3", "--dev_only",
                                "--set", "trainer.max_steps={long}"), vary={{"model.init_args.lr": ("1e-3", "2e-3")}})
plan.grid("tiny_test", "1", grid("tiny_test"), needs=lambda seed: (campaign.Need("tiny_dev"),))
args = argparse.Namespace(jobs=1, threads=1, commit=False, records=records_dir, out=out, poll=0.2)
sys.exit(campaign.Runner(args, plan).run())
"""


@pytest.mark.slow
def test_a_queue_killed_mid_cell_resumes_it_from_its_checkpoint_and_never_redoes_a_recorded_cell(
        tmp_path, tiny_model_dir, fixtures_dir):
    config = objective_config(tmp_path, tiny_model_dir, fixtures_dir, "STSRegression", "STSDataModule")
    text = open(config).read().replace("val_check_interval: 2", "val_check_interval: 4")
    open(config, "w").write(text + "last_checkpoint:\n  every_n_train_steps: 2\n")
    out, root = tmp_path / "out", tmp_path / "records"
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER.format(experiments=str(ROOT / "experiments"), out=str(out), records=str(root),
                                    config=config, sts=str(fixtures_dir / "sts"),
                                    grid=str(ROOT / "experiments" / "grid.py"), long=24))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    first = root / "tiny_dev" / "lr=1e-3" / "seed42.json"
    second = out / "tiny_dev" / "lr=2e-3" / "seed42"
    # a stop ends every process: the queue and its cells are one process group, killed without warning
    queue = subprocess.Popen([sys.executable, str(driver)], cwd=ROOT, env=env, start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while not (first.exists() and any(second.glob("train/**/checkpoints/last.ckpt"))):
        assert queue.poll() is None and time.time() < deadline, queue.stdout.read() if queue.poll() is not None else ""
        time.sleep(0.2)
    time.sleep(0.5)  # past at least one more periodic checkpoint
    os.killpg(queue.pid, signal.SIGKILL)
    queue.wait()
    assert not (root / "tiny_dev" / "lr=2e-3" / "seed42.json").exists()
    assert not (root / "tiny_test").exists()  # it waits for the whole dev grid
    kept = first.read_text()

    again = subprocess.run([sys.executable, str(driver)], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "every cell of the plan has its record" in again.stdout
    # not a terminal: one line per cell, each with the progress
    assert "done  tiny_test/base/seed42" in again.stdout and "3 of 3 cells done, 0 left" in again.stdout
    assert first.read_text() == kept  # the recorded cell was not run again
    assert len((out / "tiny_dev" / "lr=1e-3" / "seed42" / "attempts.jsonl").read_text().splitlines()) == 1
    # the stopped cell: a second attempt that resumed from its last checkpoint, past step 0
    resumed = records.load(root / "tiny_dev" / "lr=2e-3" / "seed42.json")
    assert resumed["attempts"] == 2
    log = (second / "train.log").read_text()
    steps = [int(line.rsplit("(step ", 1)[1].rstrip(")")) for line in log.splitlines()
             if "--ckpt_path last: resuming from" in line]
    assert steps and steps[-1] > 0
    assert max(p["step"] for p in resumed["dev_curve"]) == 24
    assert records.load(root / "tiny_test" / "base" / "seed42.json")["test"] is not None


def test_two_drivers_never_train_one_cell(tmp_path):
    sys.path.insert(0, str(ROOT / "experiments"))
    import fcntl

    import grid

    cell = tmp_path / "out" / "g" / "base" / "seed1"
    cell.mkdir(parents=True)
    held = open(cell / ".lock", "w")
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    args = argparse.Namespace(out=tmp_path / "out")
    with pytest.raises(grid.Busy):
        grid.run_cell(args, cell, {}, 1)
    assert not (cell / "attempts.jsonl").exists()  # nothing was started
    held.close()


def test_the_report_refuses_a_study_that_mixes_precisions(tmp_path):
    write(tmp_path, "protocol_simcse_dev", "augmentation=dropout,lr=1e-5", 42, precision="32")
    write(tmp_path, "protocol_simcse_dev", "augmentation=dropout,lr=3e-5", 42, precision="bf16-mixed")
    with pytest.raises(records.RecordError, match=r"lr=3e-5/seed42.json: trained in precision bf16-mixed, but "
                                                  r".*lr=1e-5/seed42.json of the same study \(protocol\) in 32"):
        report.check_precisions(records.load_all(tmp_path))
    # another study may run in another precision; an evaluation-only record has none
    other = tmp_path / "other"
    write(other, "objectives_dev_mnr", "lr=1e-5", 42, precision="32")
    write(other, "film_tfidf", "base", 42, precision="bf16-mixed")
    write(other, "start_mean", "base", 42, precision=None)
    report.check_precisions(records.load_all(other))


def test_the_report_refuses_a_test_cell_that_is_not_its_dev_grids_choice(tmp_path):
    for lr, dev in (("1e-5", (80.0, 70.0)), ("3e-5", (82.0, 71.0)), ("5e-5", (79.0, 70.0))):
        r = record("objectives_dev_mnr", f"lr={lr}", 42, None, dev=dev, lr=lr)
        records.write(records.path_of(tmp_path, "objectives_dev_mnr", f"lr={lr}", 42), r)
    good = record("objectives_mnr", "base", 42, 75.0)
    good["overrides"] = [f"{M}lr=3e-5"]
    records.write(records.path_of(tmp_path, "objectives_mnr", "base", 42), good)
    report.check_choices(records.load_all(tmp_path))
    bad = record("objectives_mnr", "base", 43, 75.0)
    bad["overrides"] = [f"{M}lr=5e-5"]
    records.write(records.path_of(tmp_path, "objectives_mnr", "base", 43), bad)
    with pytest.raises(records.RecordError, match=r"objectives_mnr/base/seed43.json: model.init_args.lr=5e-5, but "
                                                  r"its dev grid \(objectives_dev_mnr\) chose model.init_args.lr=3e-5"):
        report.check_choices(records.load_all(tmp_path))
    # a test cell before its dev grid has chosen
    lone = tmp_path / "lone"
    records.write(records.path_of(lone, "protocol_simcse", "base", 42), record("protocol_simcse", "base", 42, 75.0))
    with pytest.raises(records.RecordError, match="has not chosen yet"):
        report.check_choices(records.load_all(lone))


def test_the_plan_in_the_docs_is_generated_with_every_cut_and_its_reason():
    text = (ROOT / "docs" / "results" / "simcse_dclr.md").read_text()
    block = text.split("<!-- report:campaign_budget -->")[1].split("<!-- /report:campaign_budget -->")[0]
    assert all(f"`{study}`" in block for study in campaign.CUT) and "dev searches" in block


def test_a_preempted_grid_starts_no_further_cell(tmp_path, monkeypatch):
    import grid

    monkeypatch.setattr(grid.CHILDREN, "signalled", "SIGTERM")
    cell = tmp_path / "out" / "g" / "base" / "seed1"
    with pytest.raises(SystemExit) as stopped:
        grid.run_cell(argparse.Namespace(out=tmp_path / "out"), cell, {}, 1)
    assert stopped.value.code == 0 and not cell.exists()


def test_a_cells_wall_time_counts_every_attempt(tmp_path):
    import grid

    cell = tmp_path / "cell"
    (cell / "train").mkdir(parents=True)
    starts = ["2026-12-06T10:00:00+00:00", "2026-12-06T11:00:00+00:00", "2026-12-06T11:30:00+00:00"]
    (cell / "attempts.jsonl").write_text("".join(json.dumps({"started": s}) + "\n" for s in starts))
    # begun before elapsed_s was kept: each earlier attempt ran until its last file, not until the next start
    # (the first wrote for 2 minutes, then the cell waited; the second wrote for 5 minutes)
    for name, at in (("a", "2026-12-06T10:02:00+00:00"), ("b", "2026-12-06T11:05:00+00:00")):
        (cell / "train" / name).write_text("x")
        stamp = datetime.datetime.fromisoformat(at).timestamp()
        os.utime(cell / "train" / name, (stamp, stamp))
    clock = grid.Elapsed(cell, time.time())
    clock.stop()
    assert 420 <= float((cell / "elapsed_s").read_text()) < 430
    (cell / "elapsed_s").write_text("1200\n")  # the count kept by an attempt killed without warning
    clock = grid.Elapsed(cell, time.time() - 60)
    assert clock.total() == pytest.approx(1260, abs=5)
    clock.stop()
    assert float((cell / "elapsed_s").read_text()) == pytest.approx(1260, abs=5)


def test_a_done_job_whose_output_a_fresh_clone_lacks_is_remade_without_a_second_record(tmp_path, capsys):
    args = argparse.Namespace(jobs=2, threads=1, commit=False, records=tmp_path / "records", out=tmp_path / "out",
                              poll=0.1)
    made, used = tmp_path / "out" / "made.tsv", tmp_path / "records" / "use" / "done.json"
    folder = tmp_path / "records" / "make"
    folder.mkdir(parents=True)
    (folder / "first.json").write_text("{}")  # committed: the job is done, but its file is not in this clone

    def python(code: str) -> list[str]:
        return [sys.executable, "-c", code]

    write_file = f"open({str(made)!r}, 'w').write('pairs')"
    plan = campaign.Plan([
        campaign.Job("make", "base", 42, "1", lambda: python(f"{write_file}; open({str(folder / 'second.json')!r}, "
                                                             "'w').write('{}')"),
                     done_glob=str(folder / "*.json"), output=str(made), remake=lambda: python(write_file)),
        campaign.Job("use", "base", 42, "1", lambda: python(
            f"import os; assert open({str(made)!r}).read() == 'pairs'; os.makedirs({str(used.parent)!r}); "
            f"open({str(used)!r}, 'w').write('{{}}')"), needs=(campaign.Need("make"),), done_glob=str(used))])
    runner = campaign.Runner(args, plan)
    assert [j.study for j in runner.next_ready(runner.state())] == ["make"]
    assert runner.run() == 0
    out = capsys.readouterr().out
    assert f"remake {made} (make/base/seed42 again)" in out and f"remade {made}" in out
    assert "done  use/base/seed42" in out
    assert sorted(p.name for p in folder.iterdir()) == ["first.json"] and used.exists()


def test_progress_is_a_bar_on_a_terminal_and_a_line_per_cell_elsewhere(tmp_path, capsys):
    args = argparse.Namespace(jobs=2, threads=1, commit=False, records=tmp_path / "records", out=tmp_path / "out",
                              poll=0.1)
    plan = campaign.Plan()
    plan.grid("g", "1", lambda: [], vary={"model.init_args.lr": ("1e-3", "2e-3")})
    write(args.records, "g", "lr=1e-3", 42, wall=3600.0)
    runner = campaign.Runner(args, plan)
    state = runner.state()
    runner.tty = False
    runner.say("done  g/lr=1e-3/seed42", state)
    line = capsys.readouterr().out
    assert line.startswith("done  g/lr=1e-3/seed42 | 1 of 2 cells done, 1 left; 1.0 core-hours spent, about 1.0 left")
    assert line.count("\n") == 1
    runner.tty = True
    runner.say("done  g/lr=1e-3/seed42", state)
    bar = capsys.readouterr().out
    assert "\r\033[K" in bar and "[###############...............] 1 of 2 cells done" in bar


def test_every_cell_that_can_be_built_now_trains_and_evaluates_in_fp32(tmp_path):
    import yaml

    plan = campaign.build_plan(plan_args(tmp_path))
    built = 0
    for job in plan.jobs:
        try:
            command = job.command()
        except SystemExit:  # a stage that waits for a choice
            continue
        except RuntimeError:
            continue
        built += 1
        precision, encode = "32", "32"  # the Trainer's and FILM's defaults
        for i, word in enumerate(command):
            if word == "--config":
                config = yaml.safe_load((ROOT / command[i + 1]).read_text()) or {}
                precision = str((config.get("trainer") or {}).get("precision", precision))
                encode = str(((config.get("model") or {}).get("init_args") or {}).get("encode_precision", encode))
            if word == "--set" and command[i + 1].startswith("trainer.precision="):
                precision = command[i + 1].split("=", 1)[1]
            if word == "--set" and command[i + 1].startswith("model.init_args.encode_precision="):
                encode = command[i + 1].split("=", 1)[1]
        assert precision == "32" and encode == "32", (job.key, precision, encode)
        if "--eval_precision" in command:
            assert command[command.index("--eval_precision") + 1] == "32", job.key
    assert built >= 30  # the dev grids, FILM and the transfer rows


def test_the_newer_rows_mine_first_and_score_each_seeds_checkpoint_at_each_truncation(tmp_path):
    import glob as globlib

    import objectives

    args = plan_args(tmp_path)
    plan = campaign.build_plan(args)
    state = campaign.State(plan, args.records)
    ready = keys(plan, state)
    mine = next(j for j in plan.jobs if j.study == "mined_nli")
    assert mine.key in ready and not any(k.startswith("objectives_dev_mnr_mined/") for k in ready)
    command = mine.command()
    output = command[command.index("--output") + 1]
    assert output == mine.output and command[command.index("--relative_margin") + 1] == "0.05"
    # its summary becomes a record that the campaign commits with the others (docs/results/objectives.md shows it);
    # the record, not the mined file (which git ignores), says the job is done, so a fresh clone counts it the same
    folder = os.path.join(args.records, "benchmarks", "mining_nli")
    assert command[command.index("--record") + 1] == folder
    assert mine.remake() == command[:command.index("--record")]
    dev = next(j for j in plan.jobs if j.study == "objectives_dev_mnr_mined")
    assert f"data.init_args.train_sources=[{output}]" in dev.command()
    os.makedirs(folder)
    open(os.path.join(folder, "2026-12-06-cpu.json"), "w").close()
    state = campaign.State(plan, args.records)
    assert state.done(mine) and not state.usable(mine) and dev.key not in keys(plan, state)
    # the mined file lands too: its dev grid is ready; Matryoshka's needed nothing
    os.makedirs(os.path.dirname(output))
    open(output, "w").close()
    assert globlib.glob(mine.done_glob)
    ready = keys(plan, campaign.State(plan, args.records))
    assert "objectives_dev_mnr_mined/lr=1e-5/seed42" in ready and "objectives_dev_mnr_matryoshka/lr=1e-5/seed42" in ready
    # each truncation of each seed's chosen checkpoint, once that seed's test cell has a record
    trunc = [j for j in plan.jobs if j.study == "objectives_mnr_matryoshka_dim64"]
    assert sorted(j.seed for j in trunc) == [42, 43, 44]
    assert [n.study for n in trunc[0].needs] == ["objectives_mnr_matryoshka"] and trunc[0].needs[0].seed == 42
    command = trunc[0].command()
    assert command[command.index("--model") + 1] == f"{args.out}/objectives_mnr_matryoshka/base/seed42/model.ckpt"
    # what grid.py reads from the command line: evaluate.py's option, for this seed only
    parsed = grid.build_parser().parse_args(command[2:])
    assert parsed.eval_arg == ["--truncate_dim=64"] and parsed.seeds == "42"
    assert {j.study for j in plan.jobs if "_dim" in j.study} == {
        f"objectives_{n}_dim{d}" for n in ("mnr", "mnr_matryoshka") for d in objectives.TRUNCATE_DIMS}


def test_every_grid_command_of_the_plan_is_one_that_grid_py_accepts(tmp_path):
    args = plan_args(tmp_path)
    parsed = 0
    for job in campaign.build_plan(args).jobs:
        try:
            command = job.command()
        except (SystemExit, RuntimeError):  # a stage that waits for a choice
            continue
        if command[1].endswith("grid.py"):
            grid.build_parser().parse_args(command[2:])  # an error here exits with grid.py's message
            parsed += 1
    assert parsed >= 30


def test_a_seed_whose_checkpoint_later_cells_read_is_trained_again_on_a_machine_that_lacks_it(tmp_path, capsys,
                                                                                               monkeypatch):
    args = plan_args(tmp_path)
    args.out = tmp_path / "runs" / "grid"
    monkeypatch.setattr(pages_protocol, "ROOT", tmp_path)  # the page's plan reads the runs of this clone
    plan = campaign.build_plan(args)
    seed42 = next(j for j in plan.jobs if j.key == "objectives_mnr/base/seed42")
    assert seed42.output == str(args.out / "objectives_mnr" / "base" / "seed42" / "model.ckpt")
    assert seed42.remake is seed42.command  # the same cell again: grid.py keeps the record that exists
    assert next(j for j in plan.jobs if j.key == "objectives_simcse_unsup/base/seed43").output is not None
    assert next(j for j in plan.jobs if j.key == "protocol_simcse/base/seed45").output is not None
    assert next(j for j in plan.jobs if j.key == "objectives_sts_regression/base/seed42").output is None  # nothing reads it
    for seed in (42, 43, 44):
        write(args.records, "objectives_mnr", "base", seed, avg=70.0, wall=7200.0)
    state = campaign.State(plan, args.records)
    assert state.done(seed42) and not state.usable(seed42)
    assert [j.key for j in state.to_remake(plan)] == [f"objectives_mnr/base/seed{s}" for s in (42, 43, 44)]
    assert not any(k.startswith("objectives_mnr_dim") for k in keys(plan, state))
    runner = campaign.Runner(argparse.Namespace(jobs=2, threads=1, records=args.records, out=args.out), plan)
    assert {"objectives_mnr/base/seed42", "objectives_mnr/base/seed43"} <= {
        j.key for j in runner.next_ready(state)}
    campaign.print_plan(plan, state, 2)
    printed = capsys.readouterr().out
    assert "objectives_mnr/base/seed44" in printed and f"writes {seed42.output}" in printed
    # the queue's estimate counts them; the page generated from the records does not, so it reads the same on a
    # clone that has the checkpoints and on one that lacks them
    summary = campaign.summarize(plan, state, 2)
    records_only = campaign.summarize(plan, state, 2, remakes=False)
    assert summary.left_h > records_only.left_h and summary.left == records_only.left
    data = tables.Data(records.load_all(args.records), [], args.records)
    page = pages_protocol.campaign_budget(data)
    # the checkpoint of seed 42 is back: its truncations start, and only the other two seeds are trained again
    os.makedirs(os.path.dirname(seed42.output))
    open(seed42.output, "w").close()
    state = campaign.State(plan, args.records)
    assert "objectives_mnr_dim64/base/seed42" in keys(plan, state)
    assert [j.seed for j in state.to_remake(plan)] == [43, 44]
    assert campaign.summarize(plan, state, 2, remakes=False).left_h == records_only.left_h
    assert pages_protocol.campaign_budget(data) == page


def test_every_checkpoint_a_cell_reads_is_the_one_a_cell_it_waits_for_writes(tmp_path, monkeypatch):
    import objectives

    args = plan_args(tmp_path)
    # every choice made, so that each reader's command can be built
    monkeypatch.setattr(dclr_protocol.Protocol, "dclr_choice", lambda self: {})
    monkeypatch.setattr(dclr_protocol.Protocol, "simcse_choice", lambda self: {f"{M}lr": "3e-5"})
    monkeypatch.setattr(objectives, "choose", lambda found: {"values": {f"{M}lr": "3e-5"}})
    plan = campaign.build_plan(args)
    written = {(j.study, j.seed): j.output for j in plan.jobs if j.output}
    readers = 0
    for job in plan.jobs:
        command = job.command()
        read = [command[command.index("--model") + 1]] if "--model" in command else []
        read += [w.split("=", 1)[1].replace("{seed}", str(job.seed)) for w in command
                 if w.startswith(f"{M}complementary_model=")]
        for path in (p for p in read if p.startswith(str(args.out))):  # not the start model, from the hub
            assert path in {written.get((n.study, n.seed)) for n in job.needs}, (job.key, path)
            readers += 1
    # the truncations (2 rows, 3 seeds each), objectives' DCLR (its 3 dev cells, its 3 seeds), the protocol's
    # DCLR dev search (seed 42) and its 5 final seeds
    assert readers == 2 * len(objectives.TRUNCATE_DIMS) * 3 + 2 * 3 + dclr_protocol.BUDGET + 5


def test_the_budget_page_gives_each_parts_core_hours_from_its_records(tmp_path):
    root = tmp_path / "records"
    write(root, "protocol_simcse_dev", "augmentation=dropout,lr=1e-5", 42, wall=3600.0)  # one core-hour
    write(root, "objectives_dev_triplet", "lr=1e-5", 42, wall=1800.0)
    write(root, "objectives_triplet", "base", 42, avg=80.0, wall=5400.0)  # with the dev cell, two
    page = pages_protocol.campaign_budget(tables.Data(records.load_all(root), [], root))
    spent = {line.split(" | ")[0].strip("| "): line.split(" | ")[3] for line in page.splitlines()
             if line.startswith("| ") and not line.startswith("| part")}
    assert spent["1 headline"] == "1.0" and spent["2 objectives"] == "2.0" and spent["3 transfer"] == "0.0"
    assert spent["4 film pairs"] == "—"  # its job writes a benchmark record, which keeps no wall time
    assert "planned cells have records; 3.0 core-hours spent" in page  # the parts sum to the total
