"""Read, Edit and Write on an episode's repository. Each returns a ToolResult: the observation the model sees and,
for a failed call, its kind (the lab counts failed calls by kind)."""
from __future__ import annotations

from dataclasses import dataclass

from agentrl.env.coding.repository import Repository

# failed-call kinds
MALFORMED = "malformed"
NO_SUCH_FILE = "no_such_file"
EDIT_BEFORE_READ = "edit_before_read"
NOT_FOUND = "old_string_not_found"
AMBIGUOUS = "ambiguous"
IDENTICAL = "identical_strings"
REFUSED = "command_refused"
FAILED_KINDS = (MALFORMED, NO_SUCH_FILE, EDIT_BEFORE_READ, NOT_FOUND, AMBIGUOUS, IDENTICAL, REFUSED)
MAX_FILE_CHARS = 100_000


@dataclass(frozen=True)
class ToolResult:
    text: str
    failure: str | None = None   # one of FAILED_KINDS, None when the call did what it was asked

    @property
    def ok(self) -> bool:
        return self.failure is None


def error(kind: str, message: str) -> ToolResult:
    return ToolResult(f"<tool_use_error>{message}</tool_use_error>", kind)


def _file(repo: Repository, file_path: str) -> tuple[str | None, ToolResult | None]:
    try:
        name = repo.normalize(file_path)
    except ValueError as exc:
        return None, error(MALFORMED, str(exc))
    return name, None


def read(repo: Repository, file_path: str, offset: int | None = None, limit: int | None = None) -> ToolResult:
    name, failed = _file(repo, file_path)
    if failed:
        return failed
    if name not in repo.files:
        return error(NO_SUCH_FILE, f"File does not exist: {name}. Files: {', '.join(sorted(repo.files))}")
    if (offset is not None and offset < 1) or (limit is not None and limit < 1):
        return error(MALFORMED, "Read: offset and limit must be at least 1")
    lines = repo.files[name].split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    repo.read.add(name)
    if not lines:
        return ToolResult(f"<system-reminder>{name} is empty.</system-reminder>")
    start = (offset or 1) - 1
    shown = lines[start:start + limit] if limit else lines[start:]
    if not shown:
        return error(MALFORMED, f"Read: offset {offset} is past the end of {name} ({len(lines)} lines)")
    return ToolResult("\n".join(f"{start + i + 1:>6}\t{line}" for i, line in enumerate(shown)))


def edit(repo: Repository, file_path: str, old_string: str, new_string: str,
         replace_all: bool = False) -> ToolResult:
    """Exact replacement. Checked in this order: the file exists, it was Read, the strings differ, old_string
    occurs, and once only unless replace_all."""
    name, failed = _file(repo, file_path)
    if failed:
        return failed
    if name not in repo.files:
        return error(NO_SUCH_FILE, f"File does not exist: {name}. Files: {', '.join(sorted(repo.files))}")
    if name not in repo.read:
        return error(EDIT_BEFORE_READ, f"File has not been read yet. Read {name} before editing it.")
    if old_string == new_string:
        return error(IDENTICAL, "No changes to make: old_string and new_string are exactly the same.")
    text = repo.files[name]
    count = text.count(old_string) if old_string else 0
    if count == 0:
        return error(NOT_FOUND, f"String to replace not found in file.\nString: {old_string}")
    if count > 1 and not replace_all:
        return error(AMBIGUOUS, f"Found {count} matches of the string to replace, but replace_all is false. To "
                                f"replace all occurrences, set replace_all to true. To replace only one, give "
                                f"more surrounding context so the string is unique.\nString: {old_string}")
    updated = text.replace(old_string, new_string) if replace_all else text.replace(old_string, new_string, 1)
    if len(updated) > MAX_FILE_CHARS:
        return error(MALFORMED, f"Edit: the file would exceed {MAX_FILE_CHARS} characters")
    repo.files[name] = updated
    return ToolResult(f"The file {name} has been updated" +
                      (f" ({count} occurrences replaced)." if replace_all and count > 1 else "."))


def write(repo: Repository, file_path: str, content: str) -> ToolResult:
    name, failed = _file(repo, file_path)
    if failed:
        return failed
    if len(content) > MAX_FILE_CHARS:
        return error(MALFORMED, f"Write: content over {MAX_FILE_CHARS} characters")
    existed = name in repo.files
    repo.files[name] = content
    repo.read.add(name)
    return ToolResult(f"{'Updated' if existed else 'Created'} {name}.")
