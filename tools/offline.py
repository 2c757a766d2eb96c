"""Run a Pulumi program offline, under Pulumi's mocks, the way `pulumi up` would: no CLI, no cloud.

Used by the tests and by `make plan`. It applies the `config:` defaults of Pulumi.yaml the way the CLI does,
fakes what the clouds compute (ids, endpoints, emails, the Lustre mount point), answers StackReferences, and
records for every resource its inputs, parent, dependencies, provider and options.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import runpy
import sys
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import yaml
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.config import set_all_config
from pulumi.runtime.stack import run_in_stack, run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
# The organization a stack reference names on the DIY backend; mocks run under it.
ORGANIZATION = "organization"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
REDACTED = "[secret]"


@dataclass
class Registered:
    """One resource as the engine would receive it."""

    urn: str
    type: str
    name: str
    parent: str
    inputs: dict[str, Any]  # secrets unwrapped, for assertions
    raw_inputs: dict[str, Any]  # as sent, secrets still wrapped: what state would hold
    dependencies: list[str]
    property_dependencies: dict[str, list[str]]
    provider: str
    protect: bool
    ignore_changes: list[str]
    custom: bool
    delete_before_replace: bool = False
    replace_on_changes: list[str] | None = None
    replacement_trigger: Any = None  # as sent, secrets unwrapped
    replace_with: list[str] | None = None
    custom_timeouts: dict[str, str] | None = None


@dataclass
class ProgramRun:
    resources: list[Registered]
    outputs: dict[str, Any]
    secret_outputs: set[str]

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registered:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        if len(found) != 1:
            raise AssertionError(f"expected one {type_} {name or ''}, found {[r.name for r in found]}")
        return found[0]

    def by_urn(self, urn: str) -> Registered:
        return next(r for r in self.resources if r.urn == urn)

    def depends_on(self, resource: Registered, other: Registered) -> bool:
        """True if `resource` waits for `other`, directly or through any chain of dependencies or parents."""
        seen: set[str] = set()
        todo = [resource.urn]
        while todo:
            urn = todo.pop()
            if urn in seen:
                continue
            seen.add(urn)
            current = next((r for r in self.resources if r.urn == urn), None)
            if current is None:
                continue
            nexts = [*current.dependencies, *itertools.chain.from_iterable(current.property_dependencies.values())]
            if other.urn in nexts:
                return True
            todo += nexts
        return False


MOCK_PASSWORD_SEED = "MockRandomPasswordNotAToken"


def mock_password(length: int) -> str:
    """The mocked RandomPassword result of that length."""
    return (MOCK_PASSWORD_SEED * (length // len(MOCK_PASSWORD_SEED) + 1))[:length]


MOCK_CA = "TU9DSy1DQS1DRVJUSUZJQ0FURQ=="  # base64 of a placeholder, never a real certificate
MOCK_PROJECT_NUMBER = "123456789012"


def mock_dns_endpoint(location: Any) -> str:
    return f"gke-0123456789abcdef0123456789abcdef-{MOCK_PROJECT_NUMBER}.{location}.gke.goog"


class MissingConfigError(Exception):
    """What the CLI reports, before running the program, for a declared key without a default that is not set."""


class CloudMocks(pulumi_mocks.Mocks):
    """Computes the outputs the real providers would, from the inputs, so that data flows as in `pulumi up`."""

    def __init__(
        self,
        stack_outputs: Mapping[str, Mapping[str, Any]] | None = None,
        stack_secret_outputs: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        self.stack_outputs = stack_outputs or {}
        self.stack_secret_outputs = stack_secret_outputs or {}

    def new_resource(self, args: pulumi_mocks.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        inputs = dict(args.inputs)
        typ = args.typ
        name = inputs.get("name") or args.name
        project = inputs.get("project", "mock-project")
        state: dict[str, Any] = {**inputs, "name": name} if "name" in inputs or typ.startswith("gcp:") else dict(inputs)
        if typ == "pulumi:pulumi:StackReference":
            ref = str(inputs.get("name") or args.name)
            outputs = self.stack_outputs.get(ref)
            if outputs is None:
                raise ValueError(f"no outputs mocked for stack {ref!r}")
            secret_names = sorted(self.stack_secret_outputs.get(ref, ()))
            return ref, {"name": ref, "outputs": dict(outputs), "secretOutputNames": secret_names}
        if typ == "gcp:compute/network:Network":
            state["selfLink"] = f"https://www.googleapis.com/compute/v1/projects/{project}/global/networks/{name}"
            return f"projects/{project}/global/networks/{name}", state
        if typ == "gcp:compute/subnetwork:Subnetwork":
            return f"projects/{project}/regions/{inputs.get('region')}/subnetworks/{name}", state
        if typ == "gcp:serviceaccount/account:Account":
            email = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            state.update(
                email=email, member=f"serviceAccount:{email}", name=f"projects/{project}/serviceAccounts/{email}"
            )
            return state["name"], state
        if typ == "gcp:container/cluster:Cluster":
            # GKE fills in the DNS endpoint's name: gke-<cluster uid>-<project number>.<region>.gke.goog.
            endpoints = dict(inputs.get("controlPlaneEndpointsConfig") or {})
            dns = {**(endpoints.get("dnsEndpointConfig") or {}), "endpoint": mock_dns_endpoint(inputs.get("location"))}
            state.update(
                endpoint="203.0.113.10",
                masterAuth={**(inputs.get("masterAuth") or {}), "clusterCaCertificate": MOCK_CA},
                controlPlaneEndpointsConfig={**endpoints, "dnsEndpointConfig": dns},
            )
            return f"projects/{project}/locations/{inputs.get('location')}/clusters/{name}", state
        if typ == "gcp:container/nodePool:NodePool":
            return f"{inputs.get('cluster')}/nodePools/{name}", state
        if typ == "random:index/randomPassword:RandomPassword":
            # What the provider makes at random, faked: a fixed string of the asked length, so tests can look for it
            # in anything written and plans stay deterministic. The SDK marks `result` secret, as the provider does.
            state.update(result=mock_password(int(inputs.get("length", 16))), bcryptHash="mock-bcrypt-hash")
            return f"{args.name}-id", state
        if typ == "gcp:lustre/instance:Instance":
            state["mountPoint"] = f"10.32.0.2@tcp:/{inputs.get('filesystem')}"
            return f"projects/{project}/locations/{inputs.get('location')}/instances/{inputs.get('instanceId')}", state
        return f"{args.name}-id", state

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:
        if args.token == "gcp:organizations/getProject:getProject":
            project = args.args.get("projectId") or "mock-project"
            return {"projectId": project, "number": MOCK_PROJECT_NUMBER, "name": project}, []
        return {}, []


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock engine, plus a record of what each registration carried."""

    def __init__(self, mocks: pulumi_mocks.Mocks) -> None:
        super().__init__(mocks)
        self.registered: list[Registered] = []

    def _record(self, urn: str, request: Any, props: Any, **details: Any) -> None:
        raw = json_format.MessageToDict(props)
        self.registered.append(
            Registered(
                urn=urn,
                type=request.type,
                name=request.name,
                parent=request.parent,
                inputs=_unwrap(raw),
                raw_inputs=raw,
                dependencies=list(request.dependencies),
                provider=request.provider,
                **details,
            )
        )

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self._record(
                response.urn,
                request,
                request.object,
                property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items()},
                protect=bool(request.protect),
                ignore_changes=list(request.ignoreChanges),
                custom=bool(request.custom),
                delete_before_replace=bool(request.deleteBeforeReplace),
                replace_on_changes=list(request.replaceOnChanges),
                replace_with=list(request.replace_with),
                replacement_trigger=(
                    _unwrap(json_format.MessageToDict(request.replacement_trigger))
                    if request.HasField("replacement_trigger")
                    else None
                ),
                custom_timeouts=(
                    {k: v for k, v in json_format.MessageToDict(request.customTimeouts).items() if v}
                    if request.HasField("customTimeouts")
                    else None
                ),
            )
        return response

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        """A read (a StackReference): no options, nothing of ours to protect or ignore."""
        response = super().ReadResource(request)
        self._record(
            response.urn,
            request,
            request.properties,
            property_dependencies={},
            protect=False,
            ignore_changes=[],
            custom=True,
        )
        return response


def _unwrap(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return _unwrap(value.get("value"))
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def plaintext_paths(value: Any, needle: str, path: str = "") -> list[str]:
    """Where `needle` appears outside a secret wrapper: each such path would be plaintext in the state."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG_KEY) == SECRET_SIG:
            return []
        return [p for k, v in value.items() for p in plaintext_paths(v, needle, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in plaintext_paths(v, needle, f"{path}[{i}]")]
    return [path or "."] if isinstance(value, str) and needle in value else []


class StackFileError(Exception):
    """A project or stack file that is not valid YAML: one line with the file, line, column and the problem."""


# libyaml's safe loader where PyYAML has it (the same documents, parsed in C): every offline run reads the project
# file and a stack file, and the pure-Python parser was an eighth of a run's time.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_SAFE_LOADER)  # a safe loader, in C or in Python


def read_yaml(path: Path) -> Any:
    try:
        return load_yaml(path.read_text())
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"{path.name}:{mark.line + 1}:{mark.column + 1}" if mark else path.name
        raise StackFileError(f"{where}: not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{path.name}: not valid YAML: {str(error).splitlines()[0]}") from None


def encrypted_keys(config: Mapping[str, Any]) -> list[str]:
    """Keys whose stack-file value is a `secure:` ciphertext (what `pulumi config set --secret` writes); only the
    CLI, with the stack's passphrase or key, can decrypt them."""
    return sorted(key for key, value in config.items() if isinstance(value, dict) and set(value) == {"secure"})


def set_config_path(project: str, config: dict[str, Any], path: str, value: Any) -> None:
    """`pulumi config set --path a.b[0].c VALUE`, as the CLI stores it: the top-level key `project:a` holds the
    nested object, created as needed ([n] indexes a list)."""
    head, _, rest = path.partition(".")
    parts: list[str | int] = []
    for part in [head] + (rest.split(".") if rest else []):
        name, _, index = part.partition("[")
        parts.append(name)
        if index:
            parts.append(int(index.rstrip("]")))
    top = str(parts[0])
    full = top if ":" in top else f"{project}:{top}"
    if len(parts) == 1:
        config[full] = value
        return
    node = config.setdefault(full, {} if isinstance(parts[1], str) else [])
    for step, following in itertools.pairwise(parts[1:]):
        fresh: Any = {} if isinstance(following, str) else []
        if isinstance(step, int):
            node.extend([None] * (step + 1 - len(node)))
            if node[step] is None:
                node[step] = fresh
            node = node[step]
        else:
            node = node.setdefault(step, fresh)
    last = parts[-1]
    if isinstance(last, int):
        node.extend([None] * (last + 1 - len(node)))
    node[last] = value


def load_stack_config(project_dir: Path, stack: str) -> tuple[str, dict[str, Any]]:
    """Project name and the stack's config with Pulumi.yaml defaults applied, as the CLI would: keys are
    namespaced (`project:key`), declared defaults fill what the stack file leaves out. Objects set with `--path`
    are nested in the stack file and stay so. Raises StackFileError for a file that is not YAML."""
    project_file = read_yaml(project_dir / "Pulumi.yaml")
    project = project_file["name"]
    config: dict[str, Any] = {}
    for key, declaration in (project_file.get("config") or {}).items():
        full_key = key if ":" in key else f"{project}:{key}"
        if not isinstance(declaration, dict):
            config[full_key] = declaration
        elif "default" in declaration:
            config[full_key] = declaration["default"]
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        raise FileNotFoundError(f"no stack file {stack_file}")
    for key, value in ((read_yaml(stack_file) or {}).get("config") or {}).items():
        config[key if ":" in key else f"{project}:{key}"] = value
    return project, config


def _config_strings(config: Mapping[str, Any]) -> dict[str, str]:
    """Pulumi hands programs every value as a string; objects and lists as JSON (and booleans: true, false)."""
    return {
        key: json.dumps(value) if isinstance(value, (dict, list, bool)) else str(value) for key, value in config.items()
    }


@contextmanager
def _program_dir(path: Path) -> Iterator[None]:
    """Import and cwd as the language host sets them: the program's folder first on sys.path."""
    old_cwd, old_path = os.getcwd(), list(sys.path)
    sys.path.insert(0, str(path))
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old_cwd)
        sys.path[:] = old_path


def _resolve(value: Any) -> tuple[Any, bool]:
    output = pulumi.Output.from_input(value)
    resolved = _sync_await(output.future(with_unknowns=True))
    return resolved, bool(_sync_await(output.is_secret()))


@contextmanager
def _no_source_positions() -> Iterator[None]:
    """Pulumi's SDK sends the engine each resource's source position, built from traceback.extract_stack(), which
    reads the source lines of every frame: a fifth of an offline run. The mocks have no engine that shows them, so
    the runs here skip it (an empty trace, as the SDK itself sends when it finds no user frame)."""
    from pulumi.runtime import resource as sdk_resource
    from pulumi.runtime.proto import source_pb2

    saved = sdk_resource._get_stack_trace
    sdk_resource._get_stack_trace = source_pb2.StackTrace
    try:
        yield
    finally:
        sdk_resource._get_stack_trace = saved


def run_program(
    project_dir: Path,
    config: Mapping[str, Any],
    *,
    secrets: Mapping[str, str] | None = None,
    stack: str = "test",
    stack_outputs: Mapping[str, Mapping[str, Any]] | None = None,
    stack_secret_outputs: Mapping[str, Collection[str]] | None = None,
    enforce_required: bool = True,
    previous_outputs: Mapping[str, Any] | None = None,
) -> ProgramRun:
    """Run `project_dir/__main__.py` under mocks. `config` is namespaced (`project:key`); `secrets` are set as
    secret config, as `pulumi config set --secret` would. `stack_outputs` answers StackReferences, with the names in
    `stack_secret_outputs` marked secret. Like the CLI, a declared key without a default that the stack does not
    set stops the run before the program starts (`enforce_required=False` skips that, to reach the program's own
    check). `previous_outputs` answers a StackReference to the stack itself (`organization/<project>/<stack>`): the
    outputs of its last deployment, none by default (a first deployment); feed one run's `outputs` back to test
    what a second `pulumi up` does."""
    project_file = load_yaml((project_dir / "Pulumi.yaml").read_text())
    project = project_file["name"]
    self_reference = f"{ORGANIZATION}/{project}/{stack}"
    stack_outputs = {self_reference: dict(previous_outputs or {}), **(stack_outputs or {})}
    if enforce_required:
        given = set(config) | set(secrets or {})
        for key, declaration in (project_file.get("config") or {}).items():
            full_key = key if ":" in key else f"{project}:{key}"
            if isinstance(declaration, dict) and "default" not in declaration and full_key not in given:
                raise MissingConfigError(f"Stack '{stack}' is missing configuration value '{key}'")
    # Pulumi's runtime drives its futures on the thread's event loop; code run before (asyncio.run, Ray's
    # client) may have closed or unset it.
    asyncio.set_event_loop(asyncio.new_event_loop())
    mocks = CloudMocks(stack_outputs, stack_secret_outputs)
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.settings.ROOT.set(None)
    pulumi_mocks.set_mocks(
        mocks, project=project, stack=stack, preview=False, monitor=monitor, organization=ORGANIZATION
    )
    all_config = {**_config_strings(config), **{k: str(v) for k, v in (secrets or {}).items()}}
    set_all_config(all_config, secret_keys=list(secrets or {}))

    roots: list[Any] = []

    def program() -> None:
        roots.append(pulumi.runtime.settings.get_root_resource())  # the Stack run_in_stack made, for its outputs
        with _program_dir(project_dir):
            runpy.run_path(str(project_dir / "__main__.py"), run_name="__main__")

    # As the language host does: a fresh root Stack, the module's top level, then any `pulumi.run` entrypoint.
    pulumi.runtime.settings.ROOT.set(None)
    with _no_source_positions():
        _sync_await(run_pulumi_func(lambda: run_in_stack(program)))
    root = roots[0]
    outputs: dict[str, Any] = {}
    secret_outputs: set[str] = set()
    for name, value in getattr(root, "outputs", {}).items():
        resolved, is_secret = _resolve(value)
        outputs[name] = resolved
        if is_secret:
            secret_outputs.add(name)
    return ProgramRun(resources=monitor.registered, outputs=outputs, secret_outputs=secret_outputs)
