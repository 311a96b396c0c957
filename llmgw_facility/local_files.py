"""The commands on local files, no decider needed: `check-config` (agent.yaml, facility.yaml,
decider.yaml, each problem with its file and line) and `rules render` (the site's recording
rules from the facility file, written in one step)."""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from decider import facility as facility_file
from decider import rules_render
from exporter import config as agent_config
from llmgw_common.yamlfile import ConfigError
from llmgw_facility.exit_status import EXIT_BAD_FILE


def check_config(
    agent_files: list[Path],
    facility_files: list[Path] | None = None,
    decider_files: list[Path] | None = None,
) -> int:
    """Validate each agent.yaml, facility.yaml and decider.yaml (with the facility file and
    token it names); print every problem with its file and line."""
    failed = 0
    for path in agent_files:
        try:
            config = agent_config.load(path)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        print(
            f"{path}: ok (node {config.node}, rack {config.labels.rack or 'none: a rack of one'})"
        )
    for path in facility_files or []:
        try:
            facility = facility_file.load(path)
        except ConfigError as exc:
            print(exc, file=sys.stderr)
            failed += 1
            continue
        signals = ", ".join(facility.signals.configured()) or "none"
        print(
            f"{path}: ok ({len(facility.domains)} domains, {len(facility.profiles)} profiles, "
            f"signals: {signals}; mode {facility.mode})"
        )
    if decider_files:
        # The service module brings the Prometheus client along: load it only when asked.
        from decider.service import load_all

        for path in decider_files:
            try:
                loaded = load_all(path)
            except ConfigError as exc:
                print(exc, file=sys.stderr)
                failed += 1
                continue
            config = loaded.config
            token = (
                f"token file {config.token_file}"
                if config.token_file is not None
                else "no token_file: mutating calls are refused"
            )
            print(
                f"{path}: ok (listen {config.listen}, Prometheus {config.prometheus.url}, "
                f"facility {config.facility}: {len(loaded.facility.domains)} domains, mode "
                f"{loaded.facility.mode}; database {config.database}; {token})"
            )
    return 1 if failed else 0


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step: readers see the old file or the new, never half.

    The text goes to a temporary file beside it, flushed to disk, then renamed over it. A
    symbolic link is followed (the link stays); an existing file keeps its permissions.
    """
    target = path.resolve() if path.is_symlink() else path
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def render_rules(facility_path: Path, output: Path | None) -> int:
    """`rules render`: the site's rule file on stdout, or written whole to `output`."""
    try:
        facility = facility_file.load(facility_path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_FILE
    text = rules_render.render(facility, source=str(facility_path))
    if output is None or str(output) == "-":
        sys.stdout.write(text)
        return 0
    try:
        write_atomically(output, text)
    except OSError as exc:
        print(f"{output}: cannot write the rules: {exc}", file=sys.stderr)
        return 1
    count = len(rules_render.site_rules(facility))
    print(
        f"{output}: {count} rules in group {rules_render.GROUP}; "
        "reload Prometheus (SIGHUP or POST /-/reload) to load them",
        file=sys.stderr,
    )
    return 0
