"""The dangerous tier: imported names that run code, touch files, processes or the network when a pickle calls them.

Three tables (:mod:`ckptaudit.security` uses them; the allowlists are in :mod:`ckptaudit.security.tiers`):

* :data:`DANGEROUS_MODULES` / :data:`DANGEROUS_NAMES` – code execution, file,
  process, network and import machinery, attribute-walking gadgets
  (picklescan 1.0.5 ``_unsafe_globals``, ModelScan ``settings.py``, fickling's
  unsafe-imports analysis, and the names the security corpus showed missing);
* :data:`DANGEROUS_METHODS` – method names that make a protocol-4 dotted name
  (``pathlib.Path.write_text``) a file, process or code operation.

Data only: nothing here imports what it names.
"""

from __future__ import annotations

from typing import Dict

_PS = "picklescan 1.0.5 _unsafe_globals"
_MS = "ModelScan settings unsafe_globals"

#: Modules every name of which is labelled dangerous (submodules included).
DANGEROUS_MODULES: Dict[str, str] = {
    "os": f"process/file control (os.system, os.popen, os.exec*); {_PS}, {_MS}",
    "posix": f"os on Linux/macOS (pickle records os.system as posix.system); {_PS}, {_MS}",
    "nt": f"os on Windows; {_PS}, {_MS}",
    "subprocess": f"runs commands; {_PS}, {_MS}",
    "_posixsubprocess": "fork_exec primitive under subprocess",
    "sys": f"interpreter internals (sys.modules patching); {_PS}",
    "socket": f"network access; {_PS}, {_MS}",
    "ssl": f"network access (DNS exfiltration via get_server_certificate); {_PS}",
    "httplib": f"network access (Python 2); {_PS}, {_MS}",
    "http.client": "network access",
    "urllib.request": f"network access; {_PS}",
    "urllib2": "network access (Python 2)",
    "requests": f"network access; {_PS} (requests.api), {_MS}",
    "aiohttp": f"network access; {_PS}, {_MS}",
    "shutil": f"file deletion/copy; {_PS}, {_MS}",
    "runpy": f"runs modules/code; {_PS}, {_MS}",
    "importlib": "imports arbitrary modules (import_module)",
    "imp": "imports arbitrary modules (Python < 3.12)",
    "zipimport": "loads modules from archives",
    "pickle": f"nested unpickling (pickle.loads); {_PS}, {_MS}",
    "_pickle": f"nested unpickling; {_PS}",
    "marshal": "loads code objects",
    "code": f"interactive interpreter that runs source (InteractiveInterpreter.runcode); {_PS}",
    "pty": f"pty.spawn runs commands; {_PS}, {_MS}",
    "ctypes": f"foreign function calls and raw memory; {_PS}",
    "_ctypes": "foreign function calls and raw memory",
    "webbrowser": f"opens URLs/launches programs; {_PS}, {_MS}",
    "pydoc": f"pydoc.locate imports anything, pipepager runs commands; {_PS}",
    "timeit": f"timeit runs source strings; {_PS}",
    "cProfile": f"run/runctx exec source strings; {_PS}",
    "profile": f"run/runctx exec source strings; {_PS}",
    "pdb": f"debugger runs source strings; {_PS}, {_MS}",
    "bdb": f"debugger base runs source strings; {_PS}, {_MS}",
    "trace": f"Trace.run/runctx exec source strings; {_PS}",
    "multiprocessing": "starts processes",
    "asyncio": f"asyncio.subprocess / create_subprocess_shell run commands; {_PS}, {_MS}",
    "commands": f"Python 2 precursor of subprocess; {_PS}",
    "popen2": "Python 2 command runner",
    "pip": f"installs and runs packages; {_PS}",
    "ensurepip": f"runs pip; {_PS}",
    "venv": f"creates environments, runs pip; {_PS}",
    "distutils": f"spawn/write_file; {_PS} (distutils.file_util)",
    "idlelib": f"IDLE runs source (runcode, fetch_completions); {_PS}",
    "lib2to3": f"grammar loaders unpickle/eval; {_PS}",
    "test": f"test.support.script_helper spawns interpreters; {_PS}",
    "uuid": f"uuid._get_command_stdout runs commands; {_PS}",
    "_osx_support": f"runs build tools via os.system; {_PS}",
    "_aix_support": f"runs commands via os.system; {_PS}",
    "_pyrepl": f"pager runs commands; {_PS}",
    "cloudpickle": f"rebuilds functions from code objects (_make_function, subimport); {_PS}",
    "dill": "rebuilds functions and code objects from the pickle",
    "numpy.f2py": f"calls eval on strings; {_PS}",
        "torch.hub": "downloads and runs repository code (torch.hub.load)",
    "torch._inductor.codecache": f"compiles and runs code (compile_file); {_PS}",
    "torch.utils.cpp_extension": "compiles and loads native extensions",
    "torch.utils.bottleneck": f"runs profiled scripts; {_PS}",
    "torch.utils.collect_env": f"run() executes commands; {_PS}",
    "torch._dynamo.guards": f"guard code evaluation (GuardBuilder.get); {_PS}",
    "numpy.testing": f"numpy.testing._private.utils.runstring is exec; {_PS}",
    "torch._inductor": "compiles and runs code (cpp_builder.run_compile_cmd runs a shell command)",
    "torch.fx.graph_module": "reduce_graph_module execs the Python source it is given (torch 2.13 fx/graph_module.py)",
    "torch.package": "imports code from a package archive",
    "torch.jit": "compiles and runs TorchScript source (torch.jit.load/CompilationUnit)",
    "builtins.__loader__": "the import machinery",
    "_io": "file access (open, FileIO)",
    "tempfile": "creates files",
    "glob": "lists the filesystem",
    "zipfile": "reads and writes archives on disk",
    "tarfile": "extracts archives onto disk (path traversal)",
    "ftplib": "network access",
    "smtplib": "network access",
    "telnetlib": "network access",
    "xmlrpc": "network access",
    "urllib3": "network access",
    "httpx": "network access",
    "signal": "changes process signal handling",
    "resource": "changes process limits",
    "gc": "reaches every live object (gc.get_objects)",
    "inspect": "reaches frames and source of live objects",
    "threading": "starts threads that run any callable",
    "_thread": "starts threads that run any callable",
    "concurrent": "runs callables in pools",
    "sysconfig": "interpreter configuration",
    "site": "changes the import path",
    "builtins.__builtins__": "the built-in namespace",
    "_imp": "import machinery",
    "_frozen_importlib": "import machinery",
    "_frozen_importlib_external": "import machinery",
}

#: Single names labelled dangerous inside otherwise ordinary modules.
DANGEROUS_NAMES: Dict[str, str] = {
    **{f"builtins.{n}": f"built-in that runs, imports or reaches arbitrary code/files; {_PS}, {_MS}"
       for n in ("eval", "exec", "execfile", "compile", "__import__", "getattr", "setattr", "delattr",
                 "open", "breakpoint", "input", "globals", "locals", "vars", "apply", "file", "reload",
                 "help")},
    "operator.attrgetter": f"attribute-walking gadget (attrgetter('system')(os)); {_PS}",
    "operator.methodcaller": f"calls any method by name; {_PS}",
    "operator.itemgetter": f"item-walking gadget; {_PS}",
    "_operator.attrgetter": f"attribute-walking gadget; {_PS}",
    "_operator.methodcaller": f"calls any method by name; {_PS}",
    "_operator.itemgetter": f"item-walking gadget; {_PS}",
    "functools.partial": f"binds arguments to any callable (partial(os.system, cmd)); {_PS}",
    "functools.reduce": "calls any callable repeatedly",
    "_functools.partial": "binds arguments to any callable",
    "_functools.reduce": "calls any callable repeatedly",
    "pkgutil.resolve_name": f"resolves any 'module:attr', bypassing name-based lists; {_PS}",
    "types.CodeType": f"builds code objects; {_PS}",
    "types.FunctionType": "builds functions from code objects",
    "_io.FileIO": f"opens files, bypassing builtins.open lists; {_PS}",
    "io.FileIO": "opens files",
    "io.open": "opens files",
    "_io.open": "opens files",
    "logging.FileHandler": f"creates files; {_PS}",
    "doctest.debug_script": f"runs source; {_PS}",
    "imaplib.IMAP4_stream": f"runs a command through a shell; {_PS}",
    "torch.serialization.load": f"loads another (unchecked) pickle; {_PS}",
    "torch.load": "loads another (unchecked) pickle",
    "torch.fx.experimental.symbolic_shapes.ShapeEnv": f"evaluate_guards_expression evals strings; {_PS}",
    "torch.jit.unsupported_tensor_ops.execWrapper": f"exec wrapper; {_PS}",
    "torch.utils._config_module.ConfigModule": f"load_config unpickles nested data; {_PS}",
    "torch.utils.data.datapipes.utils.decoder.basichandlers": f"unpickles nested data; {_PS}",
    "torch.storage._load_from_bytes": "runs torch.load(weights_only=False) on embedded bytes",
    "numpy.load": "numpy.load(allow_pickle=True) unpickles another file",
    "numpy.lib.npyio.load": "unpickles another file",
    "joblib.load": "unpickles another file",
    "pandas.read_pickle": "unpickles another file",
    "copyreg._extension_registry": "import by extension code: the name is not in the file",
    "codecs.open": "opens (creates, truncates) files; on no picklescan 1.0.5 list",
    "codecs.EncodedFile": "wraps a file object for writing",
    "typing._eval_type": "evaluates a ForwardRef, i.e. eval() of a source string",
    "typing.ForwardRef": "holds a source string that typing evaluates with eval()",
    "typing.get_type_hints": "evaluates string annotations with eval()",
    "pathlib.Path": "path object whose methods read, write and delete files (its subclasses PosixPath/WindowsPath "
                    "are the data classes pickles hold; Path itself is only named by crafted pickles)",
    "operator.getitem": "item-walking gadget (getitem(os.environ, ...)); fickling",
    "_operator.getitem": "item-walking gadget",
}

#: Methods that turn a protocol-4 dotted name (``pathlib.Path.write_text``, ``bytes.fromhex`` is not one)
#: into a file, process, code or import operation, whatever the class.
DANGEROUS_METHODS = frozenset({
    "write_text", "write_bytes", "open", "unlink", "rmdir", "rename", "replace", "touch", "mkdir", "symlink_to",
    "hardlink_to", "chmod", "read_text", "read_bytes", "system", "popen", "spawn", "exec", "eval", "run", "call",
    "check_call", "check_output", "load", "loads", "load_config", "runcode", "runsource", "import_module",
    "__import__", "compile", "execfile", "remove", "rmtree", "copyfile", "urlopen", "connect", "Popen",
})

