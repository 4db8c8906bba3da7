"""The four coding tools as JSON-schema function declarations (the shape chat templates with tools take), and the
check of a call's arguments against them. Names and parameters follow Claude Code's Read, Edit, Write and Bash."""
from __future__ import annotations

REPO_ROOT = "/repo"
MAX_BASH_TIMEOUT_MS = 600_000


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function",
            "function": {"name": name, "description": description,
                         "parameters": {"type": "object", "properties": properties, "required": required,
                                        "additionalProperties": False}}}


TOOL_SCHEMAS = [
    _fn("Read",
        "Show a file of the repository with line numbers (`   N\\tline`). Read a file before you Edit it. "
        "offset and limit choose a window of lines for long files.",
        {"file_path": {"type": "string", "description": f"The file, e.g. {REPO_ROOT}/name.py or name.py"},
         "offset": {"type": "integer", "description": "First line to show (1 = the first line)"},
         "limit": {"type": "integer", "description": "How many lines to show"}},
        ["file_path"]),
    _fn("Edit",
        "Replace exact text in a file. old_string must appear in the file exactly as written (indentation "
        "included, no line numbers) and only once, unless replace_all is true; new_string must differ from it. "
        "The file must have been Read first.",
        {"file_path": {"type": "string", "description": "The file to change"},
         "old_string": {"type": "string", "description": "The text to replace, copied from the file"},
         "new_string": {"type": "string", "description": "The text to put in its place"},
         "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)"}},
        ["file_path", "old_string", "new_string"]),
    _fn("Write",
        "Create a file, or replace a file's whole content.",
        {"file_path": {"type": "string", "description": "The file to write"},
         "content": {"type": "string", "description": "The complete new content"}},
        ["file_path", "content"]),
    _fn("Bash",
        "Run one command in the repository. Available: `pytest [-q|-v|-x] [FILE[::TEST]]`, `python FILE.py`, "
        "`ls`, `cat FILE`, `grep [-n] [-i] [-c] TEXT [FILE...]` (grep matches plain text). No pipes, "
        "redirection or command lists. Programs run in an isolated sandbox with a time limit.",
        {"command": {"type": "string", "description": "The command line"},
         "timeout": {"type": "integer", "description": f"Milliseconds before the command is stopped "
                                                       f"(at most {MAX_BASH_TIMEOUT_MS}; runs stop after 10 s)"}},
        ["command"]),
]
TOOL_NAMES = tuple(s["function"]["name"] for s in TOOL_SCHEMAS)
_SCHEMA = {s["function"]["name"]: s["function"]["parameters"] for s in TOOL_SCHEMAS}
_TYPES = {"string": (str,), "integer": (int,), "boolean": (bool,), "number": (int, float)}


def check_call(call) -> tuple[str, dict]:
    """(name, arguments) of a well-formed call `{"name": ..., "arguments": {...}}`; ValueError naming the field
    and the allowed values otherwise."""
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("tool call: expected an object with a name and arguments")
    name = call["name"]
    if name not in _SCHEMA:
        raise ValueError(f"tool call: unknown tool {name!r}; allowed: {', '.join(TOOL_NAMES)}")
    args = call.get("arguments", {})
    if not isinstance(args, dict):
        raise ValueError(f"{name}: arguments must be an object")
    schema = _SCHEMA[name]
    unknown = sorted(set(args) - set(schema["properties"]))
    if unknown:
        raise ValueError(f"{name}: unknown parameter {unknown[0]!r}; allowed: {', '.join(schema['properties'])}")
    for field in schema["required"]:
        if field not in args:
            raise ValueError(f"{name}: missing required parameter {field!r}")
    for field, value in args.items():
        kind = schema["properties"][field]["type"]
        # bool is an int subclass: an integer field refuses True, a boolean field refuses 1
        if not isinstance(value, _TYPES[kind]) or (kind != "boolean" and isinstance(value, bool)):
            raise ValueError(f"{name}: {field} must be of type {kind}, got {type(value).__name__}")
    return name, args
