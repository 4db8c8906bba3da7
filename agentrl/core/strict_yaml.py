"""YAML as the project reads it: PyYAML's safe loader, except that a mapping with the same key twice is an error
naming the key and both lines (YAML 1.2 requires unique keys, DVC refuses them, plain PyYAML keeps the last one
silently), and a key that is not a scalar is refused."""
from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    pass


class StrictLoader(yaml.SafeLoader):
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


def load(text: str):
    """Parse `text` like yaml.safe_load, refusing duplicate keys (DuplicateKeyError, a yaml.YAMLError)."""
    return yaml.load(text, Loader=StrictLoader)
