"""YAML as the project reads it: PyYAML's safe loader, except that a mapping with the same key twice is an error
naming the key and both lines (YAML 1.2 requires unique keys, DVC refuses them, plain PyYAML keeps the last one
silently), a key that is not a scalar is refused, and the document is bounded before it is built: nesting depth
(a list nested 3,000 deep would exhaust the interpreter's stack), integer digits (Python refuses to convert more
than 4,300) and the size of the document with its aliases expanded (a "billion laughs" file is a few lines)."""
from __future__ import annotations

import yaml

MAX_DEPTH = 64              # params.yaml nests 4 deep
MAX_INT_DIGITS = 40         # a 128-bit integer has 39 digits
MAX_EXPANDED_NODES = 200_000


class DuplicateKeyError(yaml.YAMLError):
    pass


class LimitError(yaml.YAMLError):
    """A document past one of the bounds above (one line naming the bound and where)."""


class StrictLoader(yaml.SafeLoader):
    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise LimitError(f"line {mark.line + 1}: nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":   # `<<: *base`: explicit keys may override it
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    raise DuplicateKeyError(f"line {key_node.start_mark.line + 1}: a key must be a plain value, "
                                            f"not a {key_node.id}")
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKeyError(f"duplicate key {key!r} at line {line} (first at line {seen[key]})")
                seen[key] = line
        return super().construct_mapping(node, deep)

    def construct_yaml_int(self, node):
        digits = sum(c.isalnum() for c in str(node.value))
        if digits > MAX_INT_DIGITS:
            raise LimitError(f"line {node.start_mark.line + 1}: an integer of {digits:,} digits (at most "
                             f"{MAX_INT_DIGITS})")
        return super().construct_yaml_int(node)


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)


def expanded_nodes(node, memo: dict | None = None) -> int:
    """Nodes of the document with every alias expanded (an alias is the same node object reached twice)."""
    memo = {} if memo is None else memo
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1   # a cycle (a recursive alias) counts once here and is refused by the constructor
    if isinstance(node, yaml.SequenceNode):
        total = 1 + sum(expanded_nodes(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        total = 1 + sum(expanded_nodes(k, memo) + expanded_nodes(v, memo) for k, v in node.value)
    else:
        total = 1
    memo[id(node)] = total
    return total


def load(text: str):
    """Parse `text` like yaml.safe_load, refusing duplicate keys (DuplicateKeyError) and documents past the bounds
    (LimitError); both are yaml.YAMLError."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = expanded_nodes(node)
        if size > MAX_EXPANDED_NODES:
            raise LimitError(f"{size:,} values with its aliases expanded (at most {MAX_EXPANDED_NODES:,})")
        return loader.construct_document(node)
    finally:
        loader.dispose()
