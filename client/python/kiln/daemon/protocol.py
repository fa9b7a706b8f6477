"""The kiln.v1 protobuf and gRPC modules, generated from proto/ into the package (kiln/v1/) by
grpcio-tools when missing or generated from other .proto files than these."""
import hashlib
import importlib
import sys
import threading
import types
from pathlib import Path

_PROTO_ROOT = Path(__file__).resolve().parents[4] / "proto"
_OUT = Path(__file__).resolve().parents[1] / "v1"
_FILES = ("graph", "target", "artifact", "service")
_lock = threading.Lock()
_messages = None


class ProtocolUnavailable(RuntimeError):
    """The kiln.v1 modules cannot be generated or imported (grpcio-tools or protobuf missing)."""


def _proto_digest() -> str:
    h = hashlib.sha256()
    for f in _FILES:
        h.update((_PROTO_ROOT / "kiln/v1" / f"{f}.proto").read_bytes())
    return h.hexdigest()


def _stale() -> bool:
    # By content, not modification time: the modules are carried to machines without
    # grpcio-tools, and a copy does not keep the order of modification times.
    if not _PROTO_ROOT.is_dir():
        return False  # an installed package: the modules shipped with it
    for f in _FILES:
        for suffix in ("_pb2.py",) + (("_pb2_grpc.py",) if f == "service" else ()):
            if not (_OUT / f"{f}{suffix}").exists():
                return True
    try:
        init = (_OUT / "__init__.py").read_text()
    except OSError:
        return True
    return f'PROTO_SHA256 = "{_proto_digest()}"' not in init


def ensure_generated() -> None:
    """Generates kiln/v1/*_pb2.py from proto/ when they are missing or stale."""
    with _lock:
        if not _stale():
            return
        try:
            from grpc_tools import protoc
            import grpc_tools
        except ImportError as e:
            raise ProtocolUnavailable(f"grpcio-tools is not installed ({e})") from e
        # protoc writes kiln/v1/... under the output root: the package's parent directory.
        out_root = _OUT.parents[1]
        include = str(Path(grpc_tools.__file__).parent / "_proto")
        args = ["protoc", f"-I{_PROTO_ROOT}", f"-I{include}", f"--python_out={out_root}",
                f"--grpc_python_out={out_root}"]
        args += [str(_PROTO_ROOT / "kiln/v1" / f"{f}.proto") for f in _FILES]
        if protoc.main(args) != 0:
            raise ProtocolUnavailable("protoc failed on proto/kiln/v1")
        (_OUT / "__init__.py").write_text('"""kiln.v1 wire messages, generated from proto/."""\n'
                                          f'PROTO_SHA256 = "{_proto_digest()}"\n')
        for name in list(sys.modules):
            if name.startswith("kiln.v1"):
                del sys.modules[name]


def messages() -> types.SimpleNamespace:
    """graph, target, artifact, service: the message modules (no gRPC: a process that loads its
    artifacts from the cache directory never imports it)."""
    global _messages
    if _messages is None:
        ensure_generated()
        try:
            mods = {f: importlib.import_module(f"kiln.v1.{f}_pb2") for f in _FILES}
        except (ImportError, RuntimeError) as e:
            # RuntimeError: modules generated for another grpcio/protobuf than the installed one.
            raise ProtocolUnavailable(f"cannot import the kiln.v1 modules: {e}") from e
        _messages = types.SimpleNamespace(**mods)
    return _messages


def stubs():
    """The kiln.v1 service's gRPC stubs (kiln.v1.service_pb2_grpc; imports grpc)."""
    messages()
    try:
        return importlib.import_module("kiln.v1.service_pb2_grpc")
    except (ImportError, RuntimeError) as e:
        raise ProtocolUnavailable(f"cannot import the kiln.v1 service stubs: {e}") from e


def available() -> bool:
    try:
        messages()
        return True
    except ProtocolUnavailable:
        return False

