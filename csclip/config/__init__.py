"""Every config class of csclip, and the YAML + `--set` loading they share. Imports neither
torch nor ray: an entry point validates a whole config (a typo, a bad value) before anything
heavy loads. One module per program: extract, train (with model and loss), eval, report,
demo, world; base holds the loading."""

from csclip.config.base import (
    StrictModel,
    add_config_arguments,
    apply_overrides,
    deep_merge,
    flatten,
    load_config,
    parse_override,
    read_yaml,
    refuse_given,
    refuse_renamed,
    to_yaml,
    unknown_setting_text,
    validate_config,
    with_section_defaults,
)

__all__ = ["StrictModel", "add_config_arguments", "apply_overrides", "deep_merge", "flatten",
           "load_config", "parse_override", "read_yaml", "refuse_given", "refuse_renamed",
           "to_yaml", "unknown_setting_text", "validate_config", "with_section_defaults"]
