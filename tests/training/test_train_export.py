"""`nnunet_dro export` round trip through nnU-Net's real CLIs: train a test-sized DRO model with
nnUNetv2_train, export it as nnUNetTrainer, install the zip into an empty nnUNet_results with
nnUNetv2_install_pretrained_model_from_zip and predict with `nnUNetv2_predict -tr nnUNetTrainer`
in processes where `import nnunet_dro` fails and nnUNet_extTrainer is unset: the predictions
equal the original model's voxel for voxel. Also: --drop-state, the refusal of other networks
(a CPU-budget trainer's narrower network, weights of another shape), bad arguments."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import torch

from nnunet_dro import cli
from nnunet_dro.ext_trainers import TRAINER_DIR
from nnunet_dro.workflows.export import EXPORT_INFO
from train_helpers import BIN, PreprocessedDataset

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

TRAINER = "nnUNetTrainerDRO_e2eTest"
SOURCE_ID = f"{TRAINER}__nnUNetPlans__3d_fullres"
STOCK_ID = "nnUNetTrainer__nnUNetPlans__3d_fullres"


@dataclass
class TrainedModel:
    ds: PreprocessedDataset
    env: dict              # nnU-Net environment with our trainers (nnUNet_extTrainer set)
    results: Path          # nnUNet_results holding the trained model
    predictions: Path      # nnUNetv2_predict -tr TRAINER of the test image (with probabilities)
    work: Path

    @property
    def model_folder(self) -> Path:
        return self.results / self.ds.folder_name / SOURCE_ID


def run_in(args, env, cwd, timeout=600):
    """A CLI in a subprocess with its own working folder (so that `python -c` never sees /work/main)."""
    proc = subprocess.run([str(a) for a in args], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, (f"{' '.join(map(str, args))} exited with {proc.returncode}\n"
                                  f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def predict_args(ds, out, trainer, processes=1):
    """``nnUNetv2_predict`` of the test image; ``processes=0``: nnU-Net's sequential mode (``-npp 0
    -nps 0``, no spawned worker pools, each of which imports torch and nnU-Net again)."""
    return [BIN / "nnUNetv2_predict", "-i", ds.test_images, "-o", out, "-d", ds.dataset_id, "-c", "3d_fullres",
            "-f", 0, "-tr", trainer, "-device", "cpu", "-npp", processes, "-nps", processes, "--save_probabilities",
            "--disable_progress_bar"]


@pytest.fixture(scope="module")
def trained(label_dataset, test_trainer_dir, tmp_path_factory) -> TrainedModel:
    """One epoch of the test-sized DRO trainer (fold 0, with nnU-Net's final validation) in an
    nnUNet_results of its own, and its predictions of the test image."""
    ds = label_dataset
    work = tmp_path_factory.mktemp("export")
    results = work / "results_training"
    results.mkdir()
    env = dict(ds.env)
    env.update({"nnUNet_results": str(results), "nnUNet_dro_short_run": "1", "DRO_TEST_SKIP_FINAL_VALIDATION": "0",
                "nnUNet_extTrainer": os.pathsep.join([TRAINER_DIR, str(test_trainer_dir)])})
    run_in([BIN / "nnUNetv2_train", ds.dataset_id, "3d_fullres", 0, "-tr", TRAINER, "-device", "cpu"], env, work)
    predictions = work / "predictions_original"
    run_in(predict_args(ds, predictions, TRAINER), env, work)
    return TrainedModel(ds, env, results, predictions, work)


def stock_only_env(model: TrainedModel, results: Path) -> dict:
    """nnU-Net's environment without our package: a folder on PYTHONPATH shadows nnunet_dro with a
    package that raises ImportError (the editable install's finder comes after PYTHONPATH), and
    nnUNet_extTrainer is unset."""
    shadow = model.work / "shadow_site"
    (shadow / "nnunet_dro").mkdir(parents=True, exist_ok=True)
    (shadow / "nnunet_dro" / "__init__.py").write_text(
        'raise ImportError("nnunet_dro is not available in this process (export test)")\n')
    env = {k: v for k, v in model.env.items()
           if k not in ("nnUNet_extTrainer", "PYTHONPATH", "nnUNet_dro_short_run", "DRO_TEST_SKIP_FINAL_VALIDATION")}
    env.update({"PYTHONPATH": str(shadow), "nnUNet_results": str(results)})
    return env


def export(model: TrainedModel, output: Path, *extra, env=None):
    return run_in([BIN / "nnunet_dro", "export", "-d", model.ds.dataset_id, "-o", output, "-c", "3d_fullres",
                   "-tr", TRAINER, "-f", 0, *extra], env or model.env, model.work)


def load(path):
    return torch.load(str(path), map_location="cpu", weights_only=False)


def read_prediction(folder: Path):
    image = nib.load(str(folder / "test_000.nii.gz"))
    probabilities = np.load(folder / "test_000.npz")["probabilities"]
    return np.asarray(image.dataobj), image.affine, probabilities


def test_exported_model_runs_in_stock_nnunet_with_identical_predictions(trained):
    model = trained
    zip_path = model.work / "exported.zip"
    proc = export(model, zip_path)
    assert proc.stdout.strip().splitlines()[-1] == str(zip_path)
    assert "warning" not in proc.stderr

    # the zip holds what nnU-Net's own export holds, in the stock trainer's folder, plus our extras
    reference = model.work / "nnunet_export.zip"
    run_in([BIN / "nnUNetv2_export_model_to_zip", "-d", model.ds.dataset_id, "-o", reference, "-c", "3d_fullres",
            "-tr", TRAINER, "-f", 0], model.env, model.work)
    with zipfile.ZipFile(reference) as z:
        expected = {n.replace(f"/{SOURCE_ID}/", f"/{STOCK_ID}/") for n in z.namelist()}
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        info = json.loads(z.read(f"{model.ds.folder_name}/{STOCK_ID}/{EXPORT_INFO}"))
    prefix = f"{model.ds.folder_name}/{STOCK_ID}"
    assert f"{prefix}/fold_0/validation/summary.json" in expected and f"{prefix}/plans.json" in expected
    assert names == expected | {f"{prefix}/{EXPORT_INFO}", f"{prefix}/fold_0/dro_hardness.csv",
                                f"{prefix}/fold_0/dro_progress.png"}
    assert info["source_trainer"] == TRAINER and info["as_trainer"] == "nnUNetTrainer"
    assert info["extra_checkpoint_keys_kept"] == ["dro_state"]
    assert info["network_check"] == "weight names and shapes and modules"

    # a process without nnunet_dro (the shadow really hides it) and without nnUNet_extTrainer
    stock_results = model.work / "results_stock"
    stock_results.mkdir()
    env = stock_only_env(model, stock_results)
    probe = subprocess.run([str(BIN / "python"), "-c", "import nnunet_dro"], env=env, cwd=str(model.work),
                           capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "nnunet_dro is not available in this process" in probe.stderr
    assert "nnUNet_extTrainer" not in env

    # install into the empty nnUNet_results with nnU-Net's CLI
    assert not any(stock_results.iterdir())
    run_in([BIN / "nnUNetv2_install_pretrained_model_from_zip", zip_path], env, model.work)
    installed = stock_results / model.ds.folder_name / STOCK_ID
    assert sorted(p.name for p in (stock_results / model.ds.folder_name).iterdir()) == [STOCK_ID]
    for name in ("plans.json", "dataset.json", "dataset_fingerprint.json"):
        assert (installed / name).read_bytes() == (model.model_folder / name).read_bytes()

    # the checkpoint: the stock trainer's name, the same weights and nnU-Net keys, our state kept
    original = load(model.model_folder / "fold_0" / "checkpoint_final.pth")
    exported = load(installed / "fold_0" / "checkpoint_final.pth")
    assert original["trainer_name"] == TRAINER and exported["trainer_name"] == "nnUNetTrainer"
    assert set(exported) == set(original)
    assert list(exported["network_weights"]) == list(original["network_weights"])
    for key, tensor in original["network_weights"].items():
        assert torch.equal(exported["network_weights"][key], tensor), key
    assert exported["init_args"]["configuration"] == "3d_fullres" and exported["init_args"]["fold"] == 0
    assert exported["current_epoch"] == original["current_epoch"]
    assert exported["dro_state"]["case_ids"] == original["dro_state"]["case_ids"]
    np.testing.assert_array_equal(exported["dro_state"]["weighting"]["sampler"]["losses"],
                                  original["dro_state"]["weighting"]["sampler"]["losses"])

    # stock nnUNetv2_predict -tr nnUNetTrainer: identical segmentation and probabilities
    out = model.work / "predictions_stock"
    proc = run_in(predict_args(model.ds, out, "nnUNetTrainer"), env, model.work)
    assert "external trainer paths" not in proc.stdout
    seg, affine, probabilities = read_prediction(out)
    seg0, affine0, probabilities0 = read_prediction(model.predictions)
    assert seg.shape == seg0.shape and np.array_equal(seg, seg0)
    np.testing.assert_array_equal(affine, affine0)
    max_abs_difference = float(np.abs(probabilities.astype(np.float64) - probabilities0).max())
    print(f"max abs difference of the probabilities: {max_abs_difference}")
    assert max_abs_difference == 0.0
    # one epoch may not yet segment the sphere; the comparison is still between outputs that vary
    # voxel by voxel, not between two constant images
    assert np.ptp(probabilities0[1]) > 1e-3

    # the stock trainer itself, made the way nnUNetv2_train makes it, loads the whole checkpoint
    # (init_args, optimizer and grad scaler state, logging, epoch) in that process
    script = (
        "import sys, torch\n"
        "try:\n"
        "    import nnunet_dro\n"
        "    sys.exit('nnunet_dro imported')\n"
        "except ImportError:\n"
        "    pass\n"
        "from nnunetv2.run.run_training import get_trainer_from_args\n"
        f"trainer = get_trainer_from_args('{model.ds.dataset_id}', '3d_fullres', 0, 'nnUNetTrainer', "
        "device=torch.device('cpu'))\n"
        f"trainer.load_checkpoint(r'{installed / 'fold_0' / 'checkpoint_final.pth'}')\n"
        "print('LOADED', type(trainer).__name__, trainer.current_epoch, sorted(trainer.my_init_kwargs))\n")
    proc = run_in([BIN / "python", "-c", script], env, model.work)
    assert (f"LOADED nnUNetTrainer {original['current_epoch']} "
            f"['configuration', 'dataset_json', 'device', 'fold', 'plans']") in proc.stdout


def test_drop_state_and_the_warning_about_an_existing_stock_model(trained, capsys, monkeypatch):
    model = trained
    for key, value in model.env.items():
        monkeypatch.setenv(key, value)
    target = model.results / model.ds.folder_name / STOCK_ID
    target.mkdir()  # an nnUNetTrainer model of the dataset exists where the zip would be installed
    try:
        zip_path = model.work / "dropped.zip"
        code = cli.main(["export", "-d", str(model.ds.dataset_id), "-o", str(zip_path), "-tr", TRAINER, "-f", "0",
                         "--drop-state"])
    finally:
        target.rmdir()
    err = capsys.readouterr().err
    assert code == 0
    assert [line for line in err.splitlines() if "warning" in line] == [
        f"nnunet_dro export: warning: {target} exists: installing this zip into this nnUNet_results "
        f"(nnUNetv2_install_pretrained_model_from_zip) overwrites that nnUNetTrainer model's files"]
    prefix = f"{model.ds.folder_name}/{STOCK_ID}"
    with zipfile.ZipFile(zip_path) as z:
        names = set(z.namelist())
        z.extract(f"{prefix}/fold_0/checkpoint_final.pth", model.work / "dropped")
        info = json.loads(z.read(f"{prefix}/{EXPORT_INFO}"))
    assert not [n for n in names if n.rsplit("/", 1)[-1] in ("dro_hardness.csv", "dro_progress.png")]
    assert info["extra_checkpoint_keys_kept"] == [] and f"{prefix}/fold_0/progress.png" in names
    exported = load(model.work / "dropped" / prefix / "fold_0" / "checkpoint_final.pth")
    original = load(model.model_folder / "fold_0" / "checkpoint_final.pth")
    assert "dro_state" not in exported and set(exported) == set(original) - {"dro_state"}
    assert exported["trainer_name"] == "nnUNetTrainer"
    assert all(torch.equal(exported["network_weights"][k], v) for k, v in original["network_weights"].items())


def copy_model(model: TrainedModel, results: Path, trainer: str) -> Path:
    """The trained model folder under another trainer name in ``results`` (fold 0, final checkpoint)."""
    folder = results / model.ds.folder_name / f"{trainer}__nnUNetPlans__3d_fullres"
    shutil.copytree(model.model_folder, folder)
    return folder


def expect_error(capsys, argv, match, output):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nnunet_dro export: error: ") and match in lines[0], err
    assert not Path(output).exists()
    assert not [p for p in Path(output).parent.glob(".*")] if Path(output).parent.exists() else True
    return lines[0]


def test_a_cpu_budget_network_is_refused(trained, capsys, monkeypatch, tmp_path):
    """The *_CPUBudget trainers train a narrower network: exporting one as nnUNetTrainer is refused.
    The checkpoint is the trained model's with the network nnUNetTrainerDRO_CPUBudget builds from the
    same plans (what its training would save; training it would only add minutes)."""
    from nnunet_dro.lab.budget import nnUNetTrainerDRO_CPUBudget
    from nnunet_dro.workflows.export import build_network

    model = trained
    results = tmp_path / "results"
    folder = copy_model(model, results, "nnUNetTrainerDRO_CPUBudget")
    plans = json.loads((folder / "plans.json").read_text())
    dataset_json = json.loads((folder / "dataset.json").read_text())
    checkpoint = load(folder / "fold_0" / "checkpoint_final.pth")
    network = build_network(nnUNetTrainerDRO_CPUBudget, plans, dataset_json, "3d_fullres")
    checkpoint["network_weights"] = network.state_dict()
    checkpoint["trainer_name"] = "nnUNetTrainerDRO_CPUBudget"
    torch.save(checkpoint, folder / "fold_0" / "checkpoint_final.pth")
    for key, value in model.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("nnUNet_results", str(results))
    from nnunet_dro.lab.ext_trainers import LAB_TRAINER_DIR  # where the lab's twins are found

    monkeypatch.setenv("nnUNet_extTrainer", os.pathsep.join([LAB_TRAINER_DIR, model.env["nnUNet_extTrainer"]]))
    out = tmp_path / "out" / "budget.zip"
    line = expect_error(capsys, ["export", "-d", str(model.ds.dataset_id), "-o", str(out), "-tr",
                                 "nnUNetTrainerDRO_CPUBudget", "-f", "0"], "the network differs from nnUNetTrainer's",
                        out)
    assert "tensor(s) of other shape" in line and "fold_0/checkpoint_final.pth" in line and len(line) < 400
    assert not out.parent.exists()  # the folder -o would have created is gone again


def test_weights_of_another_shape_and_foreign_checkpoints_are_refused(trained, capsys, monkeypatch, tmp_path):
    model = trained
    results = tmp_path / "results"
    for key, value in model.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("nnUNet_results", str(results))
    argv = ["export", "-d", str(model.ds.dataset_id), "-f", "0"]

    # a network weight of another shape (a stock-looking class name the export cannot import)
    folder = copy_model(model, results, "nnUNetTrainerWider")
    checkpoint = load(folder / "fold_0" / "checkpoint_final.pth")
    key = next(k for k, v in checkpoint["network_weights"].items() if v.ndim == 5)
    weight = checkpoint["network_weights"][key]
    checkpoint["network_weights"][key] = torch.zeros((weight.shape[0] * 2, *weight.shape[1:]))
    torch.save(checkpoint, folder / "fold_0" / "checkpoint_final.pth")
    out = tmp_path / "wider.zip"
    line = expect_error(capsys, [*argv, "-o", str(out), "-tr", "nnUNetTrainerWider"],
                        "the network differs from nnUNetTrainer's (1 tensor(s) of other shape", out)
    assert key in line

    # an extra key that only nnunet_dro can unpickle: refused (stock nnU-Net could not load it)
    folder = copy_model(model, results, "nnUNetTrainerForeign")
    checkpoint = load(folder / "fold_0" / "checkpoint_final.pth")
    from nnunet_dro.errors import UserError
    checkpoint["dro_state"]["an_object"] = UserError("pickled as a class of nnunet_dro")
    torch.save(checkpoint, folder / "fold_0" / "checkpoint_final.pth")
    out = tmp_path / "foreign.zip"
    expect_error(capsys, [*argv, "-o", str(out), "-tr", "nnUNetTrainerForeign"],
                 "refers to nnunet_dro.errors.UserError, which a process with only nnunetv2 cannot import "
                 "(--drop-state leaves out our extra state)", out)
    assert cli.main([*argv, "-o", str(out), "-tr", "nnUNetTrainerForeign", "--drop-state"]) == 0
    assert out.is_file()
    capsys.readouterr()

    # init_args the stock constructor does not take
    folder = copy_model(model, results, "nnUNetTrainerOtherInit")
    checkpoint = load(folder / "fold_0" / "checkpoint_final.pth")
    checkpoint["init_args"]["dro_beta"] = 10.0
    torch.save(checkpoint, folder / "fold_0" / "checkpoint_final.pth")
    out = tmp_path / "init.zip"
    expect_error(capsys, [*argv, "-o", str(out), "-tr", "nnUNetTrainerOtherInit"], "do not fit nnUNetTrainer.__init__",
                 out)

    # a truncated checkpoint
    folder = copy_model(model, results, "nnUNetTrainerTruncated")
    data = (folder / "fold_0" / "checkpoint_final.pth").read_bytes()
    (folder / "fold_0" / "checkpoint_final.pth").write_bytes(data[:len(data) // 2])
    out = tmp_path / "truncated.zip"
    expect_error(capsys, [*argv, "-o", str(out), "-tr", "nnUNetTrainerTruncated"], "cannot be read as a checkpoint",
                 out)


def test_bad_arguments_are_one_line_and_write_nothing(trained, capsys, monkeypatch, tmp_path):
    model = trained
    for key, value in model.env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "new_folder" / "model.zip"
    base = ["export", "-o", str(out), "-tr", TRAINER]
    d = str(model.ds.dataset_id)
    cases = [
        ([*base, "-d", d, "-f", "0", "1"], "fold(s) 1 not trained"),
        ([*base, "-d", d, "-f", "0", "-chk", "checkpoint_nope.pth"],
         "checkpoint(s) missing: fold_0/checkpoint_nope.pth"),
        ([*base, "-d", d, "-f", "0", "-c", "2d"], "was not trained in configuration(s) 2d"),
        ([*base, "-d", "998", "-f", "0"], "-d 998: Could not find a dataset with the ID 998"),
        ([*base, "-d", d, "-f", "0", "--as-trainer", TRAINER], "not a trainer of nnunetv2"),
        (["export", "-o", str(out), "-tr", "nnUNetTrainerDRO", "-d", d, "-f", "0"], "no model of nnUNetTrainerDRO"),
    ]
    for argv, match in cases:
        expect_error(capsys, argv, match, out)
        assert not out.parent.exists()

