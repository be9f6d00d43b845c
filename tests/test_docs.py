"""The README says what the code does: a CPU check, run by every CI job.

What is checked, and the rule for each:

* **API table** (the ``| function | computes |`` table under ``## API``).  Every
  backticked ``name(args)`` in a row's first column names a function in
  ``dnnprims._PUBLIC``, and its argument list agrees with ``inspect.signature``:

  - the arguments before the row's ``*`` (all of them when the row has none)
    are the function's first parameters, same names, same order, none of them
    keyword-only; ``...`` stands for parameters left out at that point.  A row
    with ``*`` shows exactly the positional parameters (no ``...`` before the
    ``*``), so its ``*`` sits where the function's does;
  - every argument after ``*`` is keyword-only in the function, in the
    function's order;
  - a row may leave out any parameter that has a default (later arguments,
    keyword-only ones), never one without a default;
  - ``name=value`` claims the default: the parameter has one, equal to
    ``value`` and of the same type (``1`` is not ``1.0``);
  - a bare ``name`` is either a parameter without a default, or one whose
    default is the one shown for ``name`` by the nearest earlier row that shows
    one (``eps`` in ``layer_norm_backward`` is the ``eps=1e-5`` of ``layer_norm``);
    a parameter with a default that no earlier row shows must show it.

* **Signatures in the text**: a backticked ``name(args)`` outside the table whose
  arguments are all names, ``name=literal``, ``*`` or ``...`` (a signature, not a
  call such as ``set_output_reuse(False)``) follows the same rule, as a row after
  the table.
* **Public names**: every name in ``_PUBLIC`` occurs in the README.
* **Environment variables**: every ``DNNPRIMS_*`` or ``CUPY_TF32`` the README names
  is read in ``dnnprims/`` (``os.environ`` / ``os.getenv`` with the name as a string
  literal), and every ``DNNPRIMS_*`` that ``dnnprims/`` reads is in the README.
* **Commands**: every ``python -m dnnprims...`` module the README shows answers
  ``--help`` with exit status 0 on the CPU, and every ``--option`` and every
  ``a|b|c`` choice the README shows for it appears in that help; every
  ``bash scripts/...`` script and every repository path the README puts in
  backticks exists; the ``gpu_suite.sh`` modes shown are the script's, all of them.
* **Lists**: the algorithm table names exactly ``dnnprims.algos.REGISTRY`` and the
  algorithm notebook's text describes every registered algorithm, the
  project layout's ``algos/`` list names every module in ``dnnprims/algos``, the
  activation modes, their default ``alpha``, the pooling modes and the
  ``reduce_tensor`` operations are the code's.
* **Figures**: the number of public convolution problems and the held-out
  fraction the README quotes are those of ``problems.json`` and ``conv_table.json``;
  each tunable the README quotes (reuse limits, graph cache, table interpolation,
  tuner samples, thresholds) is the constant's value.
* **Behaviour the README states in words**, where it is cheap on NumPy: the
  example runs on NumPy (at batch 2) with the shapes its comments give; every
  backward function but ``conv2d_backward_bias`` takes ``None`` for a zero output
  gradient.
"""
import ast
import concurrent.futures
import functools
import glob
import inspect
import keyword
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import dnnprims

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
# Inline code spans are read with the fenced blocks taken out (a fence's backticks would pair
# with the spans' otherwise); the fenced blocks are read on their own.
FENCES = re.findall(r"^```[^\n]*\n(.*?)^```", README, re.S | re.M)
PROSE = re.sub(r"^```[^\n]*\n.*?^```", "", README, flags=re.S | re.M)
SPANS = re.findall(r"`([^`]+)`", PROSE)


def _section(title):
    """The README's text from the heading ``## title`` to the next ``## ``."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.S | re.M)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def _table_rows(text, header):
    """The rows (lists of cells) of the markdown table whose header line starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


# ---------------------------------------------------------------------- the API table

def _split_arguments(text):
    """Top-level comma-separated pieces of an argument list (brackets and quotes respected)."""
    parts, depth, quote, current = [], 0, None, ""
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
            continue
        current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


_NO_DEFAULT = object()


def _parse_signature(span):
    """(name, [(kind, name, default)]) for ``name(args)``; kind is "positional", "keyword"
    (after ``*``), "star" or "gap" (``...``)."""
    m = re.fullmatch(r"(\w+)\((.*)\)", span, re.S)
    assert m, f"{span!r} is not name(arguments)"
    args, keyword = [], False
    for piece in _split_arguments(m.group(2)):
        if piece == "*":
            keyword = True
            args.append(("star", "*", _NO_DEFAULT))
        elif piece == "...":
            args.append(("gap", "...", _NO_DEFAULT))
        else:
            name, eq, default = piece.partition("=")
            assert name.strip().isidentifier(), f"{span}: cannot read argument {piece!r}"
            value = ast.literal_eval(default.strip()) if eq else _NO_DEFAULT
            args.append(("keyword" if keyword else "positional", name.strip(), value))
    return m.group(1), args


def _api_entries():
    """(row number, function name, arguments) for every signature in the API table."""
    return [(number, *_parse_signature(span))
            for number, row in enumerate(_table_rows(_section("API"), "| function |"))
            for span in re.findall(r"`([^`]+)`", row[0])]


API = _api_entries()


def test_api_table_is_read():
    names = [name for _, name, _ in API]
    assert len(names) >= 30 and "conv2d_forward" in names and "gru_cell_backward" in names
    assert len(names) == len(set(names)), "a function has two rows in the API table"


def _same_default(shown, real):
    if type(shown) is not type(real):
        return False
    return shown == real or (isinstance(real, float) and np.isnan(real) and np.isnan(shown))


@pytest.mark.parametrize("number,name,args", API, ids=[name for _, name, _ in API])
def test_api_row_matches_signature(number, name, args):
    _check_row(number, name, args, API)


def _check_row(number, name, args, table):
    assert name in dnnprims._WHERE, f"API table row {name}(...) names no public function"
    params = inspect.signature(getattr(dnnprims, name)).parameters
    real = list(params.values())
    real_positional = [p for p in real if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    shown = [a for a in args if a[0] in ("positional", "keyword")]
    where = f"README API row {name}(...)"

    # Positional arguments: the function's first parameters, in order; a gap skips some.
    cursor, gap = 0, False
    for kind, arg, _ in args:
        if kind == "star":
            break
        if kind == "gap":
            gap = True
            continue
        names = [p.name for p in real_positional]
        assert arg in names, (f"{where}: {arg!r} is shown as positional but the function's "
                              f"positional parameters are {names}")
        at = names.index(arg)
        assert at >= cursor and (gap or at == cursor), (
            f"{where}: {arg!r} is shown at position {cursor} but is parameter {at} of {names}")
        cursor, gap = at + 1, False
    if any(kind == "star" for kind, _, _ in args):
        assert not any(kind == "gap" for kind, _, _ in args[:[a[0] for a in args].index("star")]), (
            f"{where}: '...' before '*' hides where the keyword-only marker is")
        assert cursor == len(real_positional), (
            f"{where}: '*' follows {cursor} positional arguments, the function has "
            f"{[p.name for p in real_positional]} before its keyword-only ones")

    # Keyword-only arguments: keyword-only in the function, in its order.
    keyword_names = [p.name for p in real if p.kind == p.KEYWORD_ONLY]
    order = [keyword_names.index(a) for k, a, _ in args if k == "keyword" and a in keyword_names]
    for kind, arg, _ in args:
        if kind == "keyword":
            assert arg in keyword_names, (f"{where}: {arg!r} is shown after '*' but the function's "
                                          f"keyword-only parameters are {keyword_names}")
    assert order == sorted(order), f"{where}: keyword-only arguments shown out of the function's order"

    # Nothing required is left out.
    shown_names = {a for _, a, _ in shown}
    for p in real:
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            assert p.name in shown_names, f"{where}: the required parameter {p.name!r} is not shown"

    # Defaults: shown here, or (a bare name) on the nearest earlier row that shows one.
    for kind, arg, default in shown:
        p = params[arg]
        source = where
        if default is _NO_DEFAULT and p.default is not p.empty:
            earlier = [(n, d) for n, _, a in table if n < number for k, x, d in a
                       if x == arg and d is not _NO_DEFAULT]
            if earlier:
                default = max(earlier, key=lambda e: e[0])[1]
                source = f"{where} (bare {arg!r}: the default of the nearest earlier row showing it)"
        if default is _NO_DEFAULT:
            assert p.default is p.empty, (f"{where}: {arg!r} is shown without a default and no earlier "
                                          f"row gives one, but it defaults to {p.default!r}")
        else:
            assert p.default is not p.empty, f"{source}: {arg!r} has no default in the code"
            assert _same_default(default, p.default), (
                f"{source}: {arg}={default!r}, the code says {arg}={p.default!r}")


def _is_signature(span):
    """A span outside the table shows a signature (not a call) when it has arguments and
    every one is a name, ``name=literal``, ``*`` or ``...``."""
    m = re.fullmatch(r"(?:dnnprims\.)?(\w+)\((.+)\)", span, re.S)
    if not m or m.group(1) not in dnnprims._WHERE:
        return False
    for piece in _split_arguments(m.group(2)):
        name, eq, default = piece.partition("=")
        if piece not in ("*", "...") and (not name.strip().isidentifier() or keyword.iskeyword(name.strip())):
            return False
        if eq:
            try:
                ast.literal_eval(default.strip())
            except ValueError:
                return False
    return True


TABLE_SPANS = {span for row in _table_rows(_section("API"), "| function |")
               for span in re.findall(r"`([^`]+)`", row[0])}
PROSE_SIGNATURES = [span for span in SPANS if span not in TABLE_SPANS and _is_signature(span)]


@pytest.mark.parametrize("span", PROSE_SIGNATURES, ids=[s.split("(")[0] for s in PROSE_SIGNATURES])
def test_signature_in_prose_matches(span):
    """A signature shown outside the table (``conv2d_choose``'s) follows the same rule, as if
    it were a row after the table."""
    name, args = _parse_signature(span.removeprefix("dnnprims."))
    _check_row(len(API), name, args, API)


def test_prose_signatures_found():
    assert any(s.startswith("dnnprims.conv2d_choose(") for s in PROSE_SIGNATURES)


def test_rule_catches_mismatches():
    """The checker itself: the slips it exists for fail it, and the abbreviations pass."""
    for span in ('pool(x, window, mode="max")',                   # keyword-only shown positional
                 'pool(x, window, *, mode="avg")',                # wrong default
                 'add_tensor(a, c, alpha=1, beta=1)',             # int for the code's float
                 'pool(x, *, mode="max")',                        # required `window` left out
                 'pool(x, window, *, stride=None, mode="max")',   # keyword-only out of order
                 'scale_tensor(x, *, alpha)',                     # '*' in the wrong place
                 'pool(x, window, *, modes="max")',               # no such parameter
                 'pool_backward(dy, x, y, window, *, mode)'):     # bare name, no earlier default
        with pytest.raises(AssertionError):
            _check_row(0, *_parse_signature(span), [])
    for span in ('pool(x, window)', 'pool(x, window, *, layout="NCHW")', 'add_tensor(a, c, ..., beta=1.0)',
                 'layer_norm(x, normalized_shape, ..., eps=1e-5)'):
        _check_row(0, *_parse_signature(span), [])
    table = [(0, *_parse_signature('pool(x, window, *, mode="max")')),
             (1, *_parse_signature('pool_backward(dy, x, y, window, *, mode)'))]
    _check_row(*table[1], table)
    table[0] = (0, *_parse_signature('pool(x, window, *, mode="avg")'))
    with pytest.raises(AssertionError):
        _check_row(*table[1], table)


# ---------------------------------------------------------------------- names and variables

def test_every_public_name_is_in_the_readme():
    missing = [n for n in dnnprims.__all__ if not re.search(rf"\b{re.escape(n)}\b", README)]
    assert not missing, f"public names the README never mentions: {missing}"


def _source_text():
    return {path: path.read_text() for path in (ROOT / "dnnprims").rglob("*.py")}


_ENV_READ = re.compile(r"""(?:os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*["']([A-Z_0-9]+)["']""")


def test_environment_variables_documented_and_read():
    named = set(re.findall(r"\b(DNNPRIMS_[A-Z_0-9]+|CUPY_TF32)\b", README))
    read = {v for text in _source_text().values() for v in _ENV_READ.findall(text)}
    assert "DNNPRIMS_CONV_TABLE" in read and "CUPY_TF32" in named   # the patterns still match
    assert not named - read, f"the README names variables dnnprims/ never reads: {sorted(named - read)}"
    undocumented = {v for v in read if v.startswith("DNNPRIMS_")} - named
    assert not undocumented, f"dnnprims/ reads variables the README does not document: {sorted(undocumented)}"


# ---------------------------------------------------------------------- commands and paths

def _commands():
    """{module: [the README's spans that show it]} for every ``python -m dnnprims...``."""
    commands = {}
    for span in SPANS:
        m = re.match(r"python -m (dnnprims[\w.]*)", span)
        if m:
            commands.setdefault(m.group(1), []).append(span)
    for block in FENCES:   # in a fenced block: to the end of the line, a ")" or a "#" comment
        for m in re.finditer(r"python -m (dnnprims[\w.]*)[^)#\n]*", block):
            commands.setdefault(m.group(1), []).append(m.group(0))
    return commands


COMMANDS = _commands()


@functools.lru_cache(maxsize=None)
def _help(module):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=env)


def test_readme_commands_answer_help():
    assert {"dnnprims", "dnnprims.tune", "dnnprims.bench", "dnnprims.bench.overhead"} <= set(COMMANDS)
    with concurrent.futures.ThreadPoolExecutor(len(COMMANDS)) as pool:
        results = dict(zip(COMMANDS, pool.map(_help, COMMANDS)))
    for module, spans in COMMANDS.items():
        done = results[module]
        assert done.returncode == 0, f"python -m {module} --help: exit {done.returncode}\n{done.stderr}"
        assert "usage:" in done.stdout, f"python -m {module} --help printed no usage"
        text = done.stdout
        for span in spans:
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", span):
                assert re.search(rf"(?<![\w-]){option}(?![\w-])", text), (
                    f"README shows `{option}` for python -m {module}; its --help has no such option")
            for choices in re.findall(r"(?<![\w|])([\w.]+(?:\|[\w.]+)+)", span):
                for choice in choices.split("|"):
                    assert re.search(rf"(?<![\w.]){re.escape(choice)}(?![\w.])", text), (
                        f"README shows the choice {choice!r} ({choices}) for python -m {module}; "
                        f"its --help does not offer it")


def test_readme_scripts_and_paths_exist():
    scripts = {s for block in FENCES + SPANS for s in re.findall(r"bash (scripts/[\w.-]+)", block)}
    assert {"scripts/main.sh", "scripts/test.sh", "scripts/gpu_suite.sh"} <= scripts
    paths = scripts | {p for span in SPANS for p in re.findall(
        r"(?<![\w/.$])((?:dnnprims|kernels|notes|scripts|tests|notebooks|\.ci)/[\w./*-]*)", span)}
    missing = [p for p in sorted(paths) if not glob.glob(str(ROOT / p))]
    assert not missing, f"paths the README names that do not exist: {missing}"


def test_gpu_suite_modes_exist():
    """Each ``bash scripts/gpu_suite.sh MODE`` the README shows is a mode of the script's ``case``,
    and every mode of the script is shown."""
    script = (ROOT / "scripts" / "gpu_suite.sh").read_text()
    modes = set(re.findall(r"^    (\w+)\) run_", script, re.M))
    assert {"all", "tests", "bench"} <= modes
    shown = {m for block in FENCES for m in re.findall(r"bash scripts/gpu_suite\.sh (\w+)", block)}
    shown |= set(re.findall(r"likewise `(\w+)`", README))
    assert shown <= modes, f"modes the README shows that gpu_suite.sh lacks: {sorted(shown - modes)}"
    assert modes - {"all"} <= shown, f"gpu_suite.sh modes the README does not show: {sorted(modes - shown - {'all'})}"
    for option in re.findall(r"gpu_suite\.sh tune ([^#\n]*)", README):
        options = _help("dnnprims.tune").stdout
        for flag in re.findall(r"--[a-z-]+", option):
            assert flag in options, f"README: gpu_suite.sh tune {flag}: no such tune option"


def test_project_layout_names_existing_files_and_every_algorithm_module():
    layout = next(block for block in FENCES if block.startswith("dnnprims/\n"))
    files = set(re.findall(r"(?<![\w.])(\w+\.(?:py|json|sh))\b", layout))
    known = {p.name for p in ROOT.rglob("*") if ".git" not in p.parts}
    assert not files - known, f"the project layout names files that do not exist: {sorted(files - known)}"
    m = re.search(r"algos/\s+convolution algorithm registry \(([^)]*)\)", layout)
    assert m, "the project layout's algos/ line moved: update this test"
    listed = {w.strip() for w in m.group(1).replace("\n", " ").split(",")}
    assert {"table.py", "find.py"} <= files
    modules = {p.stem for p in (ROOT / "dnnprims" / "algos").glob("*.py")} - {"__init__", "table", "find"}
    assert listed == modules, (f"the layout's algos/ list {sorted(listed)} is not the modules "
                               f"of dnnprims/algos {sorted(modules)}")


# ---------------------------------------------------------------------- lists the README spells out

def test_algorithm_table_is_the_registry():
    from dnnprims.algos import REGISTRY
    names = set()
    for row in _table_rows(_section("How convolution algorithms are chosen"), "| name |"):
        spans = re.findall(r"`([^`]+)`", row[0])
        for span in spans:
            # `implicit_gemm` (+ `_128x128`, ...): a span starting with "_" extends the first name.
            names.add(spans[0] + span if span.startswith("_") else span)
    assert names == set(REGISTRY), (f"algorithm table minus registry: {sorted(names - set(REGISTRY))}; "
                                    f"registry minus table: {sorted(set(REGISTRY) - names)}")


def test_algorithm_notebook_names_every_algorithm():
    """notebooks/02_convolution_algorithms.ipynb's text describes every registered algorithm: by
    name, a tile by its suffix (``_128x64``), a Winograd variant by its F(m x m, r x r) form."""
    import json
    from dnnprims.algos import REGISTRY
    notebook = json.loads((ROOT / "notebooks" / "02_convolution_algorithms.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
    compact = text.replace(" ", "")
    missing = []
    for name in REGISTRY:
        m = re.fullmatch(r"winograd_(?:wgrad_)?f(\d)x\d_(\d)x\d", name)
        if m:
            a, b = m.groups()
            found = f"F({a}x{a},{b}x{b})" in compact
        else:
            tile = re.fullmatch(r"implicit_gemm(_\d+x\d+)", name)
            found = re.search(rf"(?<!\w){name}(?!\w)", text) or (tile and f"`{tile.group(1)}`" in text)
        if not found:
            missing.append(name)
    assert not missing, f"registered algorithms the algorithm notebook does not describe: {missing}"


def _api_cell(function):
    rows = _table_rows(_section("API"), "| function |")
    return next(row[1] for row in rows if f"`{function}(" in row[0])


def test_activation_modes_and_alphas():
    from dnnprims.activations import DEFAULT_ALPHA
    cell = _api_cell("activation")
    modes = [span for span in re.findall(r"`([^`]+)`", cell)
             if "=" not in span and span not in ("ACTIVATION_MODES", "alpha")]
    assert modes == list(dnnprims.ACTIVATION_MODES)
    for group, alpha in re.findall(r"`([^`]+)` \(alpha[^)0-9]*([0-9.]+)\)", cell):
        for mode in group.split(","):
            assert DEFAULT_ALPHA[mode.strip()] == float(alpha), f"{mode}: README alpha {alpha}"
    shown = {m.strip() for group, _ in re.findall(r"`([^`]+)` \(alpha[^)0-9]*([0-9.]+)\)", cell)
             for m in group.split(",")}
    assert shown == set(DEFAULT_ALPHA), f"modes with an alpha whose default the README does not give: " \
                                        f"{sorted(set(DEFAULT_ALPHA) - shown)}"


def test_reduce_ops_and_pool_modes():
    from dnnprims.pooling import MODES
    from dnnprims.tensor_ops import REDUCE_OPS
    ops = re.search(r"`([a-z0-9, ]+)`", _api_cell("reduce_tensor")).group(1)
    assert tuple(o.strip() for o in ops.split(",")) == REDUCE_OPS
    shown = re.findall(r'`mode="(\w+)"`', _api_cell("pool"))
    assert tuple(shown) == MODES, f"pool modes the README names: {shown}, the code's: {MODES}"


def test_headline_figures_match_their_sources():
    """The counts the README quotes from files in the repository are those files' counts."""
    import json
    problems = json.loads((ROOT / "dnnprims" / "bench" / "problems.json").read_text())
    m = re.search(r"over the (\d+) public convolution problems", README)
    assert m and int(m.group(1)) == len({p["name"] for p in problems["conv2d"]})
    holdout = json.loads((ROOT / "dnnprims" / "algos" / "conv_table.json").read_text())["holdout"]
    m = re.search(r"fastest of ours on ([\d.]+) % of (\d+) held-out grid points", README)
    assert m, "the README's held-out figure moved: update this test"
    assert int(m.group(2)) == holdout["points"]
    assert float(m.group(1)) == round(100 * holdout["table_within_10pct"] / holdout["points"], 1)


def test_constants_the_readme_quotes():
    """Each number the README quotes for a tunable of the code is that constant's value."""
    from dnnprims import _kernels, tune
    from dnnprims.algos import dft, table, winograd
    from dnnprims import algos
    shards = re.search(r'GPU_TEST_SHARDS:-(\d+)', (ROOT / "scripts" / "gpu_suite.sh").read_text())
    quoted = {   # README pattern: the code's value
        r"Arrays over (\d+) MB are never kept": _kernels.RECYCLE_MAX_BYTES >> 20,
        r"kept arrays together stay under (\d+) MB": _kernels.RECYCLE_BUDGET_BYTES >> 20,
        r"at most (\d+) MB each, within": _kernels.RECYCLE_MAX_BYTES >> 20,
        r"the graphs of its (\d+) most\s+recent pointer sets": winograd.FULL_GRAPH_CACHE,
        r"once (\d+) of its graphs have been evicted": winograd.FULL_GRAPH_MISSES,
        r"interpolated from the (\d+) nearest entries": table.NEIGHBOURS,
        r"censored at (twice) its fastest": {2.0: "twice"}.get(table.CAP),
        r"within log2 distance (\d+) of": table.MAX_DISTANCE,
        r"a factor of\s+(\d+) in one of them": 2 ** table.MAX_DISTANCE,
        r"finalists within (\d+) % of the best": round(100 * (tune.FINALIST - 1)),
        r"finalists within \d+ % of the best get (\d+)-\d+ samples": tune.REPEAT + tune.FINAL_REPEAT,
        r"finalists within \d+ % of the best get \d+-(\d+) samples": tune.REPEAT + 2 * tune.FINAL_REPEAT,
        r"how often the table's pick is within (\d+) %": round(100 * (tune.WITHIN - 1)),
        r"`auto` takes it from (\d+) GFLOP of work": algos.AUTO_POLYPHASE_MIN_FLOPS / 1e9,
        r"for filters of (\d+) taps or more": dft.FUSED_FILTER_MIN_TAPS,
        r"runs of <= (\d+) tiles": winograd.WGRAD_MAX_SPLIT_DEPTH,
        r"GPU_TEST_SHARDS=(\d+) pytest processes": int(shards.group(1)),
    }
    for pattern, value in quoted.items():
        m = re.search(pattern, README)
        assert m, f"the README no longer says /{pattern}/: update this test"
        shown = m.group(1)
        assert (shown == value) if isinstance(value, str) or value is None else float(shown) == value, (
            f"README /{pattern}/ says {shown}, the code {value}")


def test_example_runs_on_numpy():
    """README: "The same code with numpy instead of cupy runs the reference implementations" --
    run at batch 2 instead of 32 (the shapes in its comments scaled the same way)."""
    example = re.search(r"## Example\n\n```python\n(.*?)```", README, re.S).group(1)
    assert "(32, " in example and "import cupy as cp" in example
    source = example.replace("import cupy as cp", "import numpy as cp").replace("(32, ", "(2, ")
    namespace = {}
    exec(compile(source, "README.md example", "exec"), namespace)
    for name, shape in re.findall(r"^(\w+) = .*# (\([\d, ]+\))", source, re.M):
        assert namespace[name].shape == ast.literal_eval(shape), f"README example: {name}"
    assert namespace["dw"].shape == namespace["w"].shape and namespace["dw"].dtype == np.float32


# ---------------------------------------------------------------------- behaviour stated in words

def _backward_calls():
    f = np.random.default_rng(0).standard_normal
    x, w, y = f((2, 3, 6, 6)), f((4, 3, 3, 3)), f((2, 4, 6, 6))
    rm, rv = f(3), f(3) ** 2 + 1
    rnn = dict(x=f((2, 5)), h=f((2, 4)), b_ih=None)
    return {
        "conv2d_backward_data": (lambda dy: dnnprims.conv2d_backward_data(dy, w, x.shape, padding=1), y),
        "conv2d_backward_filter": (lambda dy: dnnprims.conv2d_backward_filter(x, dy, w.shape, padding=1), y),
        "pool_backward": (lambda dy: dnnprims.pool_backward(dy, x, None, 2), f((2, 3, 3, 3))),
        "batchnorm_backward": (lambda dy: dnnprims.batchnorm_backward(dy, x, f(3)), x),
        "layer_norm_backward": (lambda dy: dnnprims.layer_norm_backward(dy, x, (6,), f(6)), x),
        "rms_norm_backward": (lambda dy: dnnprims.rms_norm_backward(dy, x, (6, 6), f((6, 6))), x),
        "group_norm_backward": (lambda dy: dnnprims.group_norm_backward(dy, x, 3, f(3)), x),
        "instance_norm_backward": (lambda dy: dnnprims.instance_norm_backward(dy, x, f(3)), x),
        "instance_norm_backward(running)": (lambda dy: dnnprims.instance_norm_backward(
            dy, x, f(3), running_mean=rm, running_var=rv, use_input_stats=False), x),
        "softmax_backward": (lambda dy: dnnprims.softmax_backward(dy, x), x),
        "log_softmax_backward": (lambda dy: dnnprims.log_softmax_backward(dy, x), x),
        "activation_backward": (lambda dy: dnnprims.activation_backward(dy, x, "gelu"), x),
        "bias_activation_backward": (lambda dy: dnnprims.bias_activation_backward(dy, x, f(3), "silu"), x),
        "lstm_cell_backward": (lambda dy: dnnprims.lstm_cell_backward(
            dy, dy, rnn["x"], rnn["h"], rnn["h"], f((16, 5)), f((16, 4)), f(16), f(16)), rnn["h"]),
        "gru_cell_backward": (lambda dy: dnnprims.gru_cell_backward(
            dy, rnn["x"], rnn["h"], f((12, 5)), f((12, 4)), f(12), f(12)), rnn["h"]),
    }


def test_every_backward_takes_none_for_a_zero_gradient():
    """README: "Backward functions accept None for an output gradient that is zero" -- the
    results equal those of an explicit zero gradient, in shape, dtype and value (zeros)."""
    calls = _backward_calls()
    covered = {n.split("(")[0] for n in calls} | {"conv2d_backward_bias"}
    assert covered == {n for n in dnnprims.__all__ if "backward" in n}, "a backward function is untested"
    for name, (call, like) in calls.items():
        with_none, with_zeros = call(None), call(np.zeros_like(like))
        with_none = with_none if isinstance(with_none, tuple) else (with_none,)
        with_zeros = with_zeros if isinstance(with_zeros, tuple) else (with_zeros,)
        assert len(with_none) == len(with_zeros), name
        for a, b in zip(with_none, with_zeros):
            assert a.shape == b.shape and a.dtype == b.dtype, f"{name}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
            assert not np.any(a) and not np.any(b), name
    with pytest.raises(TypeError, match="dy"):   # the documented exception: K is only known from dy
        dnnprims.conv2d_backward_bias(None)


def test_backward_none_gradient_still_validates():
    """dy=None skips the arithmetic, not the checks (the README: every argument is checked)."""
    x = np.zeros((2, 3, 6, 6))
    with pytest.raises(ValueError, match="gamma"):
        dnnprims.layer_norm_backward(None, x, (6,), np.ones(5))
    with pytest.raises(ValueError, match="num_groups"):
        dnnprims.group_norm_backward(None, x, 2)
    with pytest.raises(ValueError, match="running_mean"):
        dnnprims.instance_norm_backward(None, x, use_input_stats=False)
    with pytest.raises(TypeError, match="dy"):
        dnnprims.rms_norm_backward(np.zeros((2, 3, 6, 6), np.float32), x, (6,))
