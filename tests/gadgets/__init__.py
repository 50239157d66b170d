"""A corpus of pickle gadgets on no list: callables of the stdlib, numpy and torch that run code, write files,
resolve dotted names, load libraries or unpickle again when a pickle calls them (issue 24).

Each :class:`Gadget` names ``module.name`` as the pickle's ``GLOBAL`` writes it, harmless arguments, a
category and, in ``how``, what the callable does when called (as read in that library's source: the file and
function).  :func:`inject` adds every gadget of the corpus, each as one ``REDUCE`` call, to the object of a
real framework file and saves it again with ``torch.save`` and a pickler that writes the gadgets' globals
verbatim — the way a tampered checkpoint is built in public advisories (a ``__reduce__`` returning a callable
and its arguments).  Nothing here is ever unpickled by the tests except under ``weights_only=True``.
"""

from __future__ import annotations

import pickle
import types
from dataclasses import dataclass
from typing import Tuple

TMP = "/tmp/ckptaudit-gadget-never-written"


@dataclass(frozen=True)
class Gadget:
    module: str
    name: str
    args: Tuple
    category: str  # file writer | name resolver | library loader | code runner | network | nested load
    how: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


class _Ref:
    """Stands for ``module.name`` in a pickle (written as a GLOBAL by :class:`_Pickler`)."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name

    def __call__(self, *a):  # pickle's save_reduce wants a callable
        raise RuntimeError("a gadget reference is never called")


class _Call:
    def __init__(self, ref: _Ref, args: Tuple):
        self.ref, self.args = ref, args

    def __reduce__(self):
        return (self.ref, self.args)


def R(module: str, name: str) -> _Ref:
    return _Ref(module, name)


CORPUS = [
    # file writers: creating or overwriting a path is enough to damage a system
    Gadget("torch.serialization", "save", ({}, TMP), "file writer", "torch/serialization.py save(): opens f through "
           "_open_zipfile_writer and writes a new archive over it"),
    Gadget("numpy.lib._npyio_impl", "save", (TMP, 0), "file writer", "numpy/lib/_npyio_impl.py save(): opens the file "
           "for writing in binary mode (numpy 2's private module path of numpy.save)"),
    Gadget("numpy", "savez", (TMP,), "file writer", "numpy/lib/_npyio_impl.py savez(): writes a zip archive to the path"),
    Gadget("numpy", "savetxt", (TMP, (1,)), "file writer", "numpy/lib/_npyio_impl.py savetxt(): opens the path for "
           "writing text"),
    Gadget("numpy.lib.format", "open_memmap", (TMP, "w+", None, (1,)), "file writer", "numpy/lib/format.py "
           "open_memmap(): with mode w+ creates the file and writes a header"),
    Gadget("numpy", "memmap", (TMP, None, "w+", 0, (1,)), "file writer", "numpy/_core/memmap.py memmap.__new__(): "
           "mode w+ creates or truncates the file"),
    Gadget("logging", "FileHandler", (TMP,), "file writer", "logging/__init__.py FileHandler.__init__(): opens the "
           "file at once unless delay is true"),
    Gadget("logging.handlers", "RotatingFileHandler", (TMP,), "file writer", "logging/handlers.py: a FileHandler "
           "subclass, opens the file in its constructor"),
    Gadget("logging.handlers", "WatchedFileHandler", (TMP,), "file writer", "logging/handlers.py: opens the file "
           "in its constructor"),
    Gadget("zipfile", "ZipFile", (TMP, "w"), "file writer", "zipfile/__init__.py ZipFile.__init__(): mode w "
           "truncates or creates the file"),
    Gadget("tarfile", "open", (TMP, "w"), "file writer", "tarfile.py open(): mode w creates the archive"),
    Gadget("gzip", "open", (TMP, "wb"), "file writer", "gzip.py open(): mode wb creates the file"),
    Gadget("bz2", "open", (TMP, "wb"), "file writer", "bz2.py open(): mode wb creates the file"),
    Gadget("lzma", "open", (TMP, "wb"), "file writer", "lzma.py open(): mode wb creates the file"),
    Gadget("sqlite3", "connect", (TMP,), "file writer", "sqlite3.connect(): creates the database file"),
    Gadget("dbm", "open", (TMP, "c"), "file writer", "dbm/__init__.py open(): flag c creates the database"),
    Gadget("mailbox", "mbox", (TMP,), "file writer", "mailbox.py mbox(): create=True (the default) creates the file"),
    Gadget("tempfile", "mkstemp", ("", "", "/tmp"), "file writer", "tempfile.py mkstemp(): creates a file in dir"),
    Gadget("tempfile", "mkdtemp", ("", "", "/tmp"), "file writer", "tempfile.py mkdtemp(): creates a folder in dir"),
    Gadget("torch", "from_file", (TMP, True, 1), "file writer", "torch.from_file(): shared=True maps the file, "
           "creating it with the given size"),
    Gadget("copyreg", "_reconstructor", (R("logging", "FileHandler"), R("logging", "FileHandler"), TMP),
           "file writer", "copyreg.py _reconstructor(): calls base.__init__(obj, state), here FileHandler's, which "
           "opens the file"),
    # dotted-name resolvers: import any module and return any attribute, for a later REDUCE to call
    Gadget("pkgutil", "resolve_name", ("os:system",), "name resolver", "pkgutil.py resolve_name(): imports the "
           "module part and walks the attribute path"),
    Gadget("logging.config", "dictConfig", ({"version": 1},), "name resolver", "logging/config.py DictConfigurator: "
           "a '()' key names a factory by dotted path, resolved by importing it, then called"),
    Gadget("logging.config", "_resolve", ("os.system",), "name resolver", "logging/config.py _resolve(): imports each "
           "dotted component and returns the object"),
    Gadget("logging.config", "fileConfig", (TMP,), "name resolver", "logging/config.py _install_handlers(): the "
           "handler's args are passed to eval()"),
    Gadget("unittest.mock", "_importer", ("os",), "name resolver", "unittest/mock.py _importer(): __import__ of a "
           "dotted target"),
    Gadget("torch._utils", "_import_dotted_name", ("os.system",), "name resolver", "torch/_utils.py "
           "_import_dotted_name(): __import__ then getattr for each component"),
    Gadget("builtins", "map", (R("importlib", "import_module"), ("os",)), "name resolver", "map() calls its first "
           "argument, here an import-by-string helper, on each item when iterated"),
    # library loaders: dlopen runs the library's constructors
    Gadget("numpy.ctypeslib", "load_library", ("libc", "/lib"), "library loader", "numpy/ctypeslib.py load_library(): "
           "ctypes.cdll[path], a dlopen"),
    Gadget("torch.utils.cpp_extension", "load", ("x", [TMP]), "library loader", "torch/utils/cpp_extension.py load(): "
           "compiles the sources and imports the built module"),
    Gadget("torch.utils.cpp_extension", "load_inline", ("x", "int f(){return 0;}"), "library loader",
           "torch/utils/cpp_extension.py load_inline(): writes, compiles and loads C++ source"),
    Gadget("torch.hub", "load", ("owner/repo", "m"), "library loader", "torch/hub.py load(): imports the repository's "
           "hubconf.py and calls an entry point"),
    Gadget("torch.hub", "load_state_dict_from_url", ("http://127.0.0.1:9/x",), "nested load",
           "torch/hub.py load_state_dict_from_url(): downloads a file and torch.loads it"),
    Gadget("torch.jit", "load", (TMP,), "library loader", "torch/jit/_serialization.py load(): deserialises a "
           "TorchScript module whose methods then run"),
    # code runners: a string argument becomes code
    Gadget("timeit", "timeit", ("pass",), "code runner", "timeit.py Timer.__init__(): compiles stmt and exec()s it "
           "when timed"),
    Gadget("timeit", "repeat", ("pass",), "code runner", "timeit.py repeat(): builds a Timer from stmt and runs it"),
    Gadget("cProfile", "run", ("pass",), "code runner", "cProfile.py run(): exec()s the statement under the profiler"),
    Gadget("profile", "run", ("pass",), "code runner", "profile.py run(): exec()s the statement"),
    Gadget("pdb", "run", ("pass",), "code runner", "pdb.py run(): exec()s the statement under the debugger"),
    Gadget("doctest", "debug_src", (">>> 1",), "code runner", "doctest.py debug_src(): runs the examples of a "
           "docstring"),
    Gadget("pty", "spawn", ("true",), "code runner", "pty.py spawn(): forks and execs the program"),
    Gadget("webbrowser", "open", ("file:///dev/null",), "code runner", "webbrowser.py open(): starts a browser "
           "command"),
    # network: a connection out of the training cluster
    Gadget("socket", "create_connection", (("127.0.0.1", 9),), "network", "socket.py create_connection(): connects"),
    Gadget("urllib.request", "urlopen", ("http://127.0.0.1:9/",), "network", "urllib/request.py urlopen(): fetches "
           "the URL"),
    Gadget("smtplib", "SMTP", ("127.0.0.1", 9), "network", "smtplib.py SMTP.__init__(): connects when given a host"),
    Gadget("ftplib", "FTP", ("127.0.0.1",), "network", "ftplib.py FTP.__init__(): connects when given a host"),
    # nested unrestricted loads: a second unpickling with no allowlist
    Gadget("numpy.lib._npyio_impl", "load", (TMP, None, True), "nested load", "numpy/lib/_npyio_impl.py load(): "
           "allow_pickle=True (third positional) unpickles object arrays"),
    Gadget("shelve", "open", (TMP,), "nested load", "shelve.py: values are unpickled when read"),
    Gadget("marshal", "loads", (b"",), "nested load", "marshal.loads(): builds code objects from bytes"),
]


class _Pickler(pickle._Pickler):
    """torch.save's pickler, writing a :class:`_Ref` as the GLOBAL it stands for."""

    def save(self, obj, save_persistent_id=True):
        if isinstance(obj, _Ref):
            self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
            return
        super().save(obj, save_persistent_id)


PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__="ckptaudit_gadget_pickle")


def calls():
    """Every gadget of :data:`CORPUS` as one REDUCE call each."""
    return [_Call(R(g.module, g.name), g.args) for g in CORPUS]


def inject(path) -> None:
    """Load ``path`` (a real framework's torch.save file of these tests' own making), add the corpus under the
    key ``ckptaudit_gadgets`` of its top-level dict, and save it again in place."""
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=False)  # the fixture's own, trusted bytes
    if not isinstance(obj, dict):
        obj = {"state": obj}
    obj["ckptaudit_gadgets"] = calls()
    torch.save(obj, path, pickle_module=PICKLE_MODULE)
