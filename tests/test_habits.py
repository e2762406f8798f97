"""The habits CI holds the package to (issue 50): every public function and class says what it is for, and no
module outgrows one sitting (400 lines)."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "pplex_trio"
MAX_LINES = 400
MODULES = sorted(PACKAGE.rglob("*.py"))


def _documented_methods(tree: ast.Module) -> dict[str, set[str]]:
    """Each class of a module, by name, with the names of its methods that carry a docstring."""
    return {
        node.name: {
            item.name
            for item in node.body
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(item)
        }
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


TREES = {path: ast.parse(path.read_text()) for path in MODULES}
# A method that overrides a documented method of one of the package's classes keeps that contract, as
# inspect.getdoc reads it: the base's docstring is where the contract is stated once.
DOCUMENTED: dict[str, set[str]] = {}
for _tree in TREES.values():
    for _name, _methods in _documented_methods(_tree).items():
        DOCUMENTED.setdefault(_name, set()).update(_methods)


def _base_names(node: ast.ClassDef) -> list[str]:
    names = []
    for base in node.bases:
        if isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def _inherits_doc(name: str, bases: list[str], seen: frozenset[str] = frozenset()) -> bool:
    for base in bases:
        if base in seen:
            continue
        if name in DOCUMENTED.get(base, set()):
            return True
        for tree in TREES.values():
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.ClassDef)
                    and node.name == base
                    and _inherits_doc(name, _base_names(node), seen | {base})
                ):
                    return True
    return False


def undocumented(path: pathlib.Path) -> list[str]:
    """The public functions, classes and methods of one module that have no docstring."""
    missing = []

    def visit(body, owner: ast.ClassDef | None) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            if ast.get_docstring(node) is None and not (
                owner is not None and _inherits_doc(node.name, _base_names(owner))
            ):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
            if isinstance(node, ast.ClassDef):
                visit(node.body, node)

    visit(TREES[path].body, None)
    return missing


def test_every_public_function_and_class_has_a_docstring():
    missing = [entry for path in MODULES for entry in undocumented(path)]
    assert not missing, f"{len(missing)} public functions or classes without a docstring:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_module_outgrows_one_sitting(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines: split it along a seam (the limit is {MAX_LINES})"
