"""``gfcr config migrate``: a config file in the older flat shape rewritten in the one method shape
(``gfcr train``/``gfcr generate``: :mod:`gfcr.train.config_migrate`; ROSS: :func:`gfcr.ross.config.migrate`;
``gfcr simulate``: :func:`gfcr.sim.config.migrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import fail


def migrate_cmd(
    file: Annotated[Path, typer.Argument(help="A gfcr train, generate, ross or simulate YAML config.")],
    write: Annotated[bool, typer.Option("--write", help="Rewrite FILE in place (its comments are not kept).")] = False,
) -> None:
    """Print FILE in the current config shape (each method as {name, params}; one line on stderr per
    key moved); a file already current is printed unchanged."""
    import warnings

    import yaml
    from pydantic import ValidationError

    from gfcr.config import ConfigError, read_yaml_mapping
    from gfcr.generate.config import GenerateConfig
    from gfcr.ross.config import RossConfig
    from gfcr.ross.config import migrate as migrate_ross
    from gfcr.sim.config import SimConfig
    from gfcr.sim.config import migrate as migrate_sim
    from gfcr.train.config import TrainConfig
    from gfcr.train.config_migrate import migrate_any

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            kind, data = migrate_any(read_yaml_mapping(file), note=True)
            if kind == "ross":
                data = migrate_ross(data, note=True)
            elif kind == "simulate":
                data = migrate_sim(data, note=True)
            # the result must load (a check, not a rewrite: defaults stay unwritten)
            if kind == "train":
                TrainConfig.model_validate(data)
            elif kind == "generate":
                GenerateConfig.model_validate({"store": "(given by --store)"} | data)
            elif kind == "ross":
                RossConfig.model_validate({"store": "(given)"} | data)
            else:
                SimConfig.model_validate(data)
        except ConfigError as e:
            fail(f"{file}: {e}")
        except ValidationError as e:
            fail(f"{file}: the migrated {kind} config does not load: {e.errors()[0]['msg']}")
    moved = [str(w.message).split(" is the old config shape")[0] for w in caught
             if issubclass(w.category, FutureWarning) and " is the old config shape" in str(w.message)]
    for key in moved:
        typer.echo(f"moved: {key}", err=True)
    text = yaml.safe_dump(data, sort_keys=False)
    if write and moved:
        file.write_text(text)
        typer.echo(f"wrote {file} ({kind} config, {len(moved)} key(s) moved; comments are not kept)", err=True)
    elif write:
        typer.echo(f"{file}: already in the current shape ({kind} config); left as it is", err=True)
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    """Add ``gfcr config migrate`` to the top-level app."""
    group = typer.Typer(help="Config files: migrate an older shape.", no_args_is_help=True)
    group.command("migrate")(migrate_cmd)
    app.add_typer(group, name="config")
