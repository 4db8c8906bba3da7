"""A stage that stops before it finishes leaves the workspace as DVC found it: its outputs are put back.

DVC deletes a stage's outputs before it runs the stage's command (`dvc repro`, `dvc exp run`; outputs marked
`persist` excepted), so a stage that refuses a bad param (exit 2, before any compute) or is interrupted would leave
the workspace without outputs it had a moment before: `dvc status` would show them deleted and every stage
downstream changed. A stage process run by DVC ($DVC_STAGE, $DVC_ROOT) that ends without finishing puts back each of
its outputs that is wholly missing, from the DVC cache as dvc.lock records it: what `dvc checkout <output>` would do,
which cannot run here (DVC holds the repository's lock while it runs the stage). Each output is copied beside its
place and renamed into it, so it is the committed output whole or absent. Only the outputs DVC deletes are put back
(cached, not `persist`: a persistent output the user removed stays removed); an output the stage wrote in part is
left as the stage left it; one the cache does not hold is named in one warning line.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from agentrl.core import files


def _lock_entry(root: Path, stage: str) -> dict:
    import yaml
    try:
        text = files.read_text(root / "dvc.lock", files.MAX_TEXT_BYTES, "dvc.lock")
        lock = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        entry = lock.get("stages", {}).get(stage)
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return {}
    return entry if isinstance(entry, dict) else {}


def missing_outputs(root: Path, stage: str) -> list[dict]:
    """The cached outputs dvc.lock records for `stage` (path, md5) that are not in the workspace at all."""
    outs = _lock_entry(root, stage).get("outs") or []
    return [o for o in outs if isinstance(o, dict) and isinstance(o.get("path"), str) and isinstance(o.get("md5"), str)
            and not os.path.lexists(root / o["path"])]


def _copy_object(cache, md5: str, dest: Path) -> None:
    """The cache object `md5` (a file, or a directory's manifest `<md5>.dir`) at `dest`, which must not exist."""
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.restore")
    try:
        if md5.endswith(".dir"):
            tmp.mkdir(parents=True)
            for item in json.loads(Path(cache.oid_to_path(md5)).read_text()):
                target = tmp / item["relpath"]
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cache.oid_to_path(item["md5"]), target)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cache.oid_to_path(md5), tmp)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise


def restore_outputs(stage: str | None = None, root: Path | str | None = None) -> list[str]:
    """Put back the outputs of the stage DVC is running (see the module doc); returns the paths put back. Outside
    DVC (no $DVC_STAGE or $DVC_ROOT) it does nothing."""
    stage, root = stage or os.environ.get("DVC_STAGE"), root or os.environ.get("DVC_ROOT")
    if not stage or not root:
        return []
    root = Path(root)
    missing = missing_outputs(root, stage)
    if not missing:
        return []
    restored = []
    try:
        from dvc.repo import Repo
        with Repo(str(root)) as repo:
            defined = repo.stage.load_one(path=str(root / "dvc.yaml"), name=stage)
            removed = {str(o.def_path) for o in defined.outs if o.use_cache and not o.persist}   # what DVC deletes
            for out in (o for o in missing if o["path"] in removed):
                try:
                    _copy_object(repo.cache.repo, out["md5"], root / out["path"])
                    restored.append(out["path"])
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
                    print(f"warning: {stage}: its output {out['path']} is missing and could not be put back from the "
                          f"DVC cache ({why}); `dvc checkout {out['path']}` or `dvc pull` restores it",
                          file=sys.stderr)
    except Exception as exc:   # no DVC repository here after all, or DVC cannot read its own files
        print(f"warning: {stage}: its outputs {', '.join(o['path'] for o in missing)} are missing and DVC could not "
              f"be asked where they are ({type(exc).__name__}); `dvc checkout` restores them", file=sys.stderr)
    return restored
