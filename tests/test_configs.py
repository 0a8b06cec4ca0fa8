"""Configs: every YAML file in configs/ loads; a bad field is named before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from csclip.config import load_config
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TRAIN_CONFIGS = ["default.yaml", "coco.yaml", "coco_authors.yaml", "paper.yaml"]


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_train_config_loads(name):
    config = load_config(TrainConfig, CONFIGS / name)
    assert config.loss.method == "csclip"


def test_coco_config_is_the_papers_setting():
    config = load_config(TrainConfig, CONFIGS / "coco.yaml")
    assert (config.model.name, config.model.pretrained, config.model.quick_gelu) == \
        ("ViT-B-32", "openai", True)
    assert (config.optim.lr, config.optim.betas, config.optim.eps) == (5e-6, (0.9, 0.98), 1e-6)
    assert (config.optim.weight_decay, config.optim.epochs, config.optim.grad_clip) == (0.01, 5, 1.0)
    assert (config.data.batch_size, config.sampling.num_unit_slots, config.loss.unit_loss_weight,
            config.run.seed) == (128, 2, 0.5, 42)


def test_coco_authors_preset_is_the_authors_run():
    config = load_config(TrainConfig, CONFIGS / "coco_authors.yaml")
    paper = load_config(TrainConfig, CONFIGS / "coco.yaml")
    optim = config.optim
    assert (optim.schedule, optim.warmup_epochs, optim.warmup_start_ratio) == ("authors_per_epoch", 3, 0.1)
    assert optim.decay_all_params and not config.loss.gather and config.run.num_workers == 1
    assert config.run.precision == "fp16"
    # Everything else as the paper's setting: the same sampling, loss weight, AdamW, batch.
    assert config.sampling == paper.sampling
    assert (optim.lr, optim.betas, optim.eps, optim.weight_decay, optim.epochs, optim.grad_clip) == \
        (paper.optim.lr, paper.optim.betas, paper.optim.eps, paper.optim.weight_decay,
         paper.optim.epochs, paper.optim.grad_clip)
    assert (config.model, config.data.batch_size, config.loss.unit_loss_weight) == \
        (paper.model, paper.data.batch_size, paper.loss.unit_loss_weight)


@pytest.mark.parametrize("workers", [1, 2, 4, 8])
def test_paper_preset_is_the_authors_run_on_any_number_of_gpus(workers):
    # The authors' run (coco_authors.yaml: one GPU, 128 negatives) as one optimisation on
    # any worker count: 128 rows per step, gathered, the per-epoch schedule, no clamp.
    config = load_config(TrainConfig, CONFIGS / "paper.yaml", [f"run.num_workers={workers}"])
    authors = load_config(TrainConfig, CONFIGS / "coco_authors.yaml")
    assert (config.data.batch_size, config.data.batch_scope, config.data.shuffle_buffer) == \
        (128, "global", 0)
    assert config.loss.gather and config.optim.logit_scale_max is None
    assert config.optim.model_dump(exclude={"logit_scale_max"}) == \
        authors.optim.model_dump(exclude={"logit_scale_max"})
    assert (config.sampling, config.model, config.run.precision, config.run.seed) == \
        (authors.sampling, authors.model, authors.run.precision, authors.run.seed)
    assert config.loss.model_dump(exclude={"gather"}) == authors.loss.model_dump(exclude={"gather"})


def test_paper_preset_cites_the_authors_code_for_every_field():
    import yaml

    text = (CONFIGS / "paper.yaml").read_text()
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()
             if line.startswith("  ") and not line.strip().startswith("#")}
    explained = {"storage_path", "checkpoint_every", "cpus_per_worker", "use_gpu", "seed",
                 "log_every", "max_failures", "experiment"}  # where it runs, not what
    for section, fields in yaml.safe_load(text).items():
        for key in fields:
            assert key in explained or "#" in lines[key], f"{section}.{key} has no source"


def test_coco_config_states_where_every_value_comes_from():
    # each field of coco.yaml says paper / authors / ours, and where they differ.
    import yaml

    text = (CONFIGS / "coco.yaml").read_text()
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()
             if line.startswith("  ") and not line.strip().startswith("#")}
    for section in ("model", "data", "sampling", "loss", "optim"):
        for key in yaml.safe_load(text)[section]:
            assert any(tag in lines[key] for tag in ("[paper]", "[authors]", "[ours]")), key


def test_every_yaml_in_configs_loads():
    # Other pipelines' configs are loaded by their own tests; here: nothing unparsable.
    import yaml

    for path in CONFIGS.glob("*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict), path


@pytest.mark.parametrize("override, field", [
    ("optim.lr=-1", "optim.lr"),
    ("optim.shedule=cosine", "optim.shedule"),
    ("loss.method=clipp", "loss.method"),
    ("data.world.image_size=500", "data.world.image_size"),
    ("sampling.num_unit_slots=0", "sampling.num_unit_slots"),
    ("optim.betas=[0.9, 1.5]", "optim"),
])
def test_bad_override_names_its_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(TrainConfig, CONFIGS / "default.yaml", [override])


def test_entry_point_reports_bad_field_in_one_line_and_exits_2(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "train_entry", CONFIGS.parent / "pipelines" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--method", "negclip", "--set", "optim.warmup_steps=-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "optim.warmup_steps" in err
    assert module.main(["--demo", "--set", "pretrain.optim.max_steps=0"]) == 2
    assert "pretrain.optim.max_steps" in capsys.readouterr().err



def test_demo_yaml_holds_the_demos_deltas():
    # configs/demo.yaml is DemoConfig's defaults: its three deltas, each validated as a
    # training config when the demo loads.
    import yaml

    from csclip.config.demo import DemoConfig

    data = yaml.safe_load((CONFIGS / "demo.yaml").read_text())
    assert set(data) == {"pretrain", "warm_start", "finetune"}
    demo = DemoConfig()
    assert (demo.pretrain, demo.warm_start, demo.finetune) == (
        data["pretrain"], data["warm_start"], data["finetune"])
    assert demo.warm_start_config().loss.method == "layout"

def test_world_gpu_is_a_demo_yaml_with_image_foils_for_cs_clip_only():
    # the GPU world config runs through the demo; image foils are ours, opt-in,
    # and never reach the CLIP-FT baseline.
    from csclip.demo import finetune_config, pretrain_config
    from csclip.entry.demo import build_parser, demo_config

    config = demo_config(build_parser().parse_args(
        ["--config", str(CONFIGS / "world_gpu.yaml"), "--set", "train.optim.lr=1e-4"]))
    assert config.train.model.name == "csclip-small" and config.train.run.use_gpu
    assert config.train.optim.lr == 1e-4 and config.train.optim.max_steps == 5000
    assert config.pretrain_config().optim.max_steps == 5000 and config.out_dir == "runs/world_gpu"
    cs_clip, clip_ft = (finetune_config(config, method, "ckpt") for method in ("csclip", "clip"))
    assert cs_clip.loss.image_foils and cs_clip.loss.image_foil_weight == 2.0
    assert not clip_ft.loss.image_foils
    assert cs_clip.model.lock.image and clip_ft.model.lock.image  # after the warm start
    pre = pretrain_config(config)
    assert pre.loss.method == "clip" and pre.loss.image_foil_weight == 2.0
    assert pre.data.batch_size == 128 and pre.run.use_gpu
    warm = config.warm_start_config()  # the layout warm start (ours), on the pretraining's data
    assert warm.loss.method == "layout" and warm.optim.max_steps == 3000
    assert warm.data.world == pre.data.world and warm.optim.schedule == "constant"


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_paper_presets_keep_image_foils_off(name):
    assert not load_config(TrainConfig, CONFIGS / name).loss.image_foils


@pytest.mark.parametrize("name", ["coco.yaml", "coco_authors.yaml", "paper.yaml"])
def test_paper_presets_draw_relation_foils_as_the_authors(name):
    # relation_foil_weights is ours: the paper presets keep the authors'
    # uniform draw.
    assert load_config(TrainConfig, CONFIGS / name).sampling.relation_foil_weights == {}


def test_demo_takes_a_fine_tuning_yaml_as_its_train_section():
    from csclip.entry.demo import build_parser, demo_config

    config = demo_config(build_parser().parse_args(
        ["--config", str(CONFIGS / "default.yaml"), "--max-steps", "7"]))
    assert config.train.optim.max_steps == 7 and config.train.model.name == "csclip-tiny"


@pytest.mark.parametrize("override,field", [
    ("train.run.name=mine", "train.run.name"),
    ("train.model.pretrained=openai", "train.model.pretrained"),
    ("train.loss.method=negclip", "train.loss.method"),
])
def test_demo_refuses_the_fields_it_sets_itself(override, field):
    from csclip.config.demo import DemoConfig

    with pytest.raises(ConfigError, match=field):
        load_config(DemoConfig, None, [override])


@pytest.mark.parametrize("override,field", [("model.grad_checkpointing=true", "model.grad_checkpointing"),
                                            ("model.lock.image=true", "model.lock")])
def test_evaluation_refuses_training_options_it_would_ignore(override, field):
    from csclip.config.eval import EvalConfig

    with pytest.raises(ConfigError, match=field):
        load_config(EvalConfig, None, [override])
    assert load_config(EvalConfig, None, ["model.quick_gelu=true"]).model.quick_gelu


def _config_class_of(section: str):
    """The config whose YAML has `section` at its top level (the removed fields' sections)."""
    from csclip.config.eval import EvalConfig
    from csclip.config.extract import ExtractConfig
    from csclip.config.shards import ShardsConfig

    for model in (TrainConfig, EvalConfig, ShardsConfig, ExtractConfig):
        if section in model.model_fields:
            return model
    raise AssertionError(f"no config has a {section} section")


def test_a_removed_field_says_what_replaced_it():
    from csclip.config.base import REMOVED_FIELDS

    for path, advice in REMOVED_FIELDS.items():
        section, field = path.split(".")
        model = _config_class_of(section)
        with pytest.raises(ConfigError) as caught:
            load_config(model, None, [f"{path}=1"])
        message = str(caught.value)
        assert len(message.splitlines()) == 1 and f"{path} is no longer a field: {advice}" in message
    # A demo's sections name it with their prefix.
    from csclip.config.demo import DemoConfig

    with pytest.raises(ConfigError, match=r"pretrain\.run\.best_mode is no longer a field"):
        load_config(DemoConfig, None, ["pretrain.run.best_mode=max"])


@pytest.mark.parametrize("value, mode", [("true", "default"), ("false", None), ("null", None),
                                         ("max-autotune", "max-autotune")])
def test_run_compile_takes_a_flag_or_a_mode(value, mode):
    assert load_config(TrainConfig, None, [f"run.compile={value}"]).run.compile == mode
