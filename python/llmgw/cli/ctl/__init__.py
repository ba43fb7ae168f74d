"""`llmgw ctl`: the admin API from the command line, one command per row of `commands.COMMANDS`.

Exit statuses: 0 done; 1 the server said no (its message and code are printed);
2 a usage error; 3 the server cannot be reached; 4 no token, or the server did
not accept it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import paths
from .client import Answer, Client, Unreachable
from .commands import COMMANDS, Arg, Command
from .render import block, table

OK, REFUSED, USAGE, UNREACHABLE, BAD_TOKEN = 0, 1, 2, 3, 4
DEFAULT_SERVER = "http://127.0.0.1:8081"


def configure(parser: argparse.ArgumentParser) -> None:
    """Adds the global options and one subcommand per row of COMMANDS."""
    parser.add_argument("--server", metavar="URL",
                        help=f"the control plane's admin URL (default $LLMGW_SERVER or {DEFAULT_SERVER})")
    parser.add_argument("--token", help="the admin token (default $LLMGW_ADMIN_TOKEN, "
                                        "then DATA_DIR/admin-token)")
    parser.add_argument("--token-file", metavar="PATH", type=Path, help="read the admin token from PATH")
    parser.add_argument("--data-dir", metavar="DIR", type=Path,
                        help="the control plane's data dir, where admin-token is (on its machine)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds to wait for an answer (default 60)")
    parser.add_argument("--json", action="store_true", help="print the server's JSON, for scripts")
    nouns = parser.add_subparsers(dest="ctl_noun", metavar="NOUN", required=True)
    verb_groups: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    noun_parsers: dict[str, argparse.ArgumentParser] = {}
    for cmd in COMMANDS:
        noun = noun_parsers.get(cmd.noun)
        if noun is None:
            default = next((c for c in COMMANDS if c.noun == cmd.noun and not c.verb), None)
            noun = noun_parsers[cmd.noun] = nouns.add_parser(
                cmd.noun, help=(default.help if default else f"{cmd.noun}: " + ", ".join(
                    c.verb for c in COMMANDS if c.noun == cmd.noun)))
            if default is None:
                # `ctl nodes` lists them, like `ctl nodes list` (when listing needs no argument).
                default = next((c for c in COMMANDS if c.noun == cmd.noun and c.verb == "list"
                                and all(a.flag.startswith("-") for a in c.args)), None)
            if default is not None:
                # `ctl usage --since 24h`: the noun alone is a command, with its options.
                _add_args(noun, default)
                noun.set_defaults(_ctl=default)
        if not cmd.verb:
            continue
        if cmd.noun not in verb_groups:
            verb_groups[cmd.noun] = noun.add_subparsers(
                dest="ctl_verb", metavar="VERB", required=noun.get_default("_ctl") is None)
        p = verb_groups[cmd.noun].add_parser(
            cmd.verb, help=cmd.help, description=cmd.help[0].upper() + cmd.help[1:] + ".")
        _add_args(p, cmd)
        if cmd.output == "csv":
            p.add_argument("--output", "-o", metavar="FILE", type=Path, help="write to FILE, not stdout")
        p.set_defaults(_ctl=cmd)


def _add_args(p: argparse.ArgumentParser, cmd: Command) -> None:
    for a in cmd.args:
        dest = _dest(a)
        if a.replaces:
            p.add_argument(a.replaces, dest=_old(a), help=argparse.SUPPRESS)
        if not a.flag.startswith("-"):
            p.add_argument(dest, metavar=a.flag, help=a.help)
            if a.kind in _NEW:
                # `teams create acme ml`: parsed, so that it is answered with the one-path form.
                p.add_argument(_old(a), nargs="?", help=argparse.SUPPRESS)
        elif a.kind == "flag":
            p.add_argument(a.flag, dest=dest, action="store_true", help=a.help)
        elif a.kind == "bool":
            p.add_argument(a.flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=a.help)
        else:
            metavar = (None if a.choices else _FORMS.get(a.kind)
                       or a.flag.lstrip("-").upper().replace("-", "_"))
            p.add_argument(a.flag, dest=dest, required=a.required, choices=a.choices,
                           default=a.default, type=int if a.kind == "int" else str, help=a.help,
                           metavar=metavar)
    # Also after the verb (`ctl orgs list --json`), not only before the noun.
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


_LEVELS: dict[str, paths.Level] = {"org": "org", "team": "team", "project": "project"}
_NEW: dict[str, paths.Level] = {"new-org": "org", "new-team": "team", "new-project": "project"}
_PARENT = {"team": "org", "project": "team"}
"""The body field a new team's or project's parent path goes to."""
_FORMS = {**paths.FORM, "scope": "SCOPE"}


def _dest(a: Arg) -> str:
    return "arg_" + re.sub(r"[^a-z0-9]+", "_", a.flag.lstrip("-").lower())


def _old(a: Arg) -> str:
    """Where an old spelling of `a` lands: an option it replaces, a second positional."""
    return "old_" + _dest(a)


def _old_forms(cmd: Command, args: argparse.Namespace) -> None:
    """Refuses an option or argument form that a path argument takes the place of, showing
    the command in the path form."""
    for a in cmd.args:
        old = getattr(args, _old(a), None)
        if old is None:
            continue
        words = f"llmgw ctl {cmd.noun} {cmd.verb}"
        if a.replaces:
            raise _Usage(f"{a.replaces} is spelled {a.flag} here, with a path: "
                         f"{words} {a.flag} {paths.unprefixed(old)}")
        level = _NEW[a.kind]
        joined = f"{getattr(args, _dest(a))}/{old}"
        depth = paths.LEVELS.index(level) + 1
        example = joined if joined.count("/") + 1 == depth else paths.EXAMPLE[level]
        raise _Usage(f"{cmd.noun} {cmd.verb} takes the new {paths.WHAT[level]} as one path, "
                     f"{paths.FORM[level]}, not as two arguments: {words} {example}")


def _token(args: argparse.Namespace) -> tuple[str | None, str]:
    """(token, where it was looked for)."""
    if args.token:
        return args.token, "--token"
    if args.token_file:
        return _read_token(args.token_file), f"--token-file {args.token_file}"
    env = os.environ.get("LLMGW_ADMIN_TOKEN")
    if env:
        return env.strip(), "$LLMGW_ADMIN_TOKEN"
    from llmgw.control.settings import default_data_dir

    path = (args.data_dir or default_data_dir()) / "admin-token"
    return _read_token(path), str(path)


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _request(cmd: Command, args: argparse.Namespace) -> tuple[str, dict[str, str], bytes | None]:
    _old_forms(cmd, args)
    path = cmd.path
    query: dict[str, str] = {}
    body: dict[str, Any] = {}
    for a in cmd.args:
        value = getattr(args, _dest(a))
        if value is None or (a.kind == "flag" and not value):
            continue
        try:
            if a.kind in _LEVELS:
                value = paths.reference(_LEVELS[a.kind], str(value), a.flag)
            elif a.kind == "scope":
                value = paths.scope(str(value), a.flag)
            elif a.kind in _NEW:
                parent, value = paths.new(_NEW[a.kind], str(value), a.flag)
                if parent:
                    body[_PARENT[_NEW[a.kind]]] = parent
        except paths.BadPath as e:
            raise _Usage(str(e)) from None
        if a.kind == "int" and not isinstance(value, int):
            try:
                value = int(value)
            except ValueError:
                raise _Usage(f"{a.flag} must be a whole number, not {value!r}") from None
        if a.kind == "list":
            value = [v.strip() for v in str(value).split(",") if v.strip()]
        if a.kind == "model":
            body = _model_file(Path(value))
            continue
        if a.to == "path":
            text = str(value).replace("/", ":") if a.kind in _LEVELS else str(value)
            path = path.replace("{" + a.field + "}", quote(text, safe=":"))
        elif a.to == "query":
            query[a.field] = "true" if value is True else str(value)
        else:
            *parents, leaf = a.field.split(".")
            node = body
            for name in parents:
                node = node.setdefault(name, {})
            node[leaf] = value
    if cmd.output == "csv" and args.json:
        query["format"] = "json"
    if cmd.method == "PATCH" and not body:
        opts = ", ".join(a.flag for a in cmd.args if a.to == "body")
        raise _Usage(f"nothing to change: give at least one of {opts}")
    wants_body = cmd.method in ("POST", "PATCH", "PUT") and any(a.to == "body" for a in cmd.args)
    return path, query, (json.dumps(body).encode() if wants_body else None)


class _Usage(Exception):
    pass


def _model_file(path: Path) -> dict[str, Any]:
    """One model from a YAML or JSON file, validated here (so a bad field is named with its
    path before anything is sent) and with sizes like 80GiB in bytes, as the API takes them."""
    import msgspec
    import yaml

    from llmgw.control.catalog import CatalogError, load_models

    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise _Usage(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise _Usage(f"{path} is not valid YAML or JSON: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("models"), list) and len(doc["models"]) == 1:
        doc = doc["models"][0]  # a whole server.yaml-style file with one model
    try:
        [model] = load_models([doc], str(path))
    except CatalogError as e:
        raise _Usage(str(e)) from None
    body: dict[str, Any] = msgspec.to_builtins(model)
    return body


def run(args: argparse.Namespace) -> int:
    """Calls the command's route and shows the answer; returns the exit status."""
    cmd: Command = args._ctl
    try:
        path, query, body = _request(cmd, args)
    except _Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE
    token, source = _token(args)
    if token is None:
        print(f"error: no admin token: none in {source}; give --token or --token-file, set "
              "LLMGW_ADMIN_TOKEN, or run where the control plane's data dir is (--data-dir)",
              file=sys.stderr)
        return BAD_TOKEN
    server = args.server or os.environ.get("LLMGW_SERVER") or DEFAULT_SERVER
    try:
        client = Client(server, token, args.timeout)
        answer = client.call(cmd.method, path, query, body)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return UNREACHABLE
    if answer.status >= 400:
        return _refused(answer, source, server)
    return _show(cmd, args, answer)


def _refused(answer: Answer, source: str, server: str) -> int:
    try:
        err = json.loads(answer.body)["error"]
        message, code = str(err["message"]), str(err.get("code"))
    except (ValueError, KeyError, TypeError):
        text = answer.body[:200].decode(errors="replace")
        print(f"error: the server answered HTTP {answer.status} without an llmgw error: {text}",
              file=sys.stderr)
        return REFUSED
    print(f"error: {message} [{code}]", file=sys.stderr)
    if answer.status == 401:
        print(f"hint: the token was read from {source}", file=sys.stderr)
        return BAD_TOKEN
    if answer.status == 404 and code == "not_found":
        # The control plane says `admin.not_found` for a route it lacks; a bare `not_found`
        # is how an llmgw gateway (or some other OpenAI server) answers /api/v1.
        print(f"hint: {server} answered like an OpenAI endpoint (a gateway?), not a control plane; "
              f"point --server (or LLMGW_SERVER) at the admin API, {DEFAULT_SERVER} by default",
              file=sys.stderr)
    return REFUSED


def _show(cmd: Command, args: argparse.Namespace, answer: Answer) -> int:
    if cmd.output == "csv" and not args.json:
        if args.output is not None:
            args.output.write_bytes(answer.body)
            print(f"wrote {args.output}", file=sys.stderr)
        else:
            text = answer.body.decode()
            sys.stdout.write(text if not text or text.endswith("\n") else text + "\n")
        return OK
    data: Any = json.loads(answer.body) if answer.body else None
    if args.json:
        if cmd.output == "csv" and args.output is not None:
            args.output.write_text(json.dumps(data, indent=2) + "\n")
        else:
            print(json.dumps(data, indent=2))
        return OK
    if cmd.output == "routes":
        rows = [{"method": m.upper(), "path": p, "summary": op.get("summary", "")}
                for p, ops in data["paths"].items() for m, op in ops.items()]
        print(table(rows, cmd.columns))
    elif cmd.output == "table":
        print(table(data, cmd.columns) if data else f"no {cmd.noun}")
    elif cmd.output == "key":
        # The key alone on stdout (KEY=$(llmgw ctl keys issue ...) works); the rest to stderr.
        print(data["key"])
        view = {k: v for k, v in data.items() if k != "key"}
        print(block(view, cmd.columns), file=sys.stderr)
        print("This key will not be shown again: store it now.", file=sys.stderr)
    elif cmd.output == "token":
        # The token alone on stdout (TOKEN=$(llmgw ctl nodes join-token) works).
        print(data["token"])
        view = {k: v for k, v in data.items() if k != "token"}
        print(block(view, cmd.columns), file=sys.stderr)
        print("This token will not be shown again. On the new node run: llmgw agent "
              "--join-token TOKEN --control-plane HOST:AGENT_PORT", file=sys.stderr)
    elif cmd.output == "done":
        values = {a.field: getattr(args, _dest(a)) for a in cmd.args}
        print(cmd.done.format(**values))
    elif cmd.output == "json" or not isinstance(data, dict):
        print(json.dumps(data, indent=2))
    else:
        print(block(data, cmd.columns))
    return OK
