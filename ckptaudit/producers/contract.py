"""The shape of what the audit knows about one producer: its contracts, file roles, resume loads and resume call.

A :class:`Producer` is everything the audit knows about one framework's checkpoints, held in that
producer's own module of :mod:`ckptaudit.producers` (one module per producer); the stages ask the
registry (:func:`ckptaudit.producers.for_layout`, :func:`ckptaudit.producers.identify`) and name no
framework themselves.

* :class:`Contract` — which files form a unit and what each is for, under one framework and version
  range; identified per unit from its files and tree (switched off by ``CKPTAUDIT_PRODUCER_CONTRACTS=0``).
* :class:`Producer` — keyed by the inventory layouts whose units the framework resumes (structural, so
  the verdict is the same with the contracts off): the base-name patterns of each file role, how the
  resume unpickles each role (:class:`ResumeLoad`), the resume call to print and which unit the
  framework's default resume would take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, Optional, Sequence, Tuple, Union

__all__ = ["FileRole", "Contract", "RestoreRule", "CountRule", "RequiredKeys", "ResumeLoad", "PointerFile",
           "UnfinishedMarker", "Producer", "WO", "UNSAFE"]

#: How a file is loaded, in words: torch's restricted unpickler, or full unpickling.
WO = "torch.load(weights_only=True)"
UNSAFE = "torch.load(weights_only=False)"


@dataclass(frozen=True)
class FileRole:
    """One file of a contract's unit: ``pattern`` (fnmatch on the base name), its ``role`` (``weights``,
    ``optimizer``, ``scheduler``, ``scaler``, ``rng``, ``sampler``, ``trainer_state``, ``custom``,
    ``metadata`` or ``mixed``) and how the producer's resume reads it (``loaded_by``; ``never`` when not)."""

    pattern: str
    role: str
    loaded_by: str


@dataclass(frozen=True)
class Contract:
    """What one framework's save writes and its resume reads, for one version range.

    ``match_files`` (fnmatch on base names) identifies a folder unit, ``match_keys`` (all at a file's root)
    a file unit; ``keys`` maps a role to dotted paths in a file's tree; ``step_at``/``epoch_at`` are
    ``"file pattern:dotted.path"``; ``name_number`` says whether the number in a unit's name is a step or a
    save counter (``"save_index"``); ``saves``/``never_saves`` are components always / never written."""

    producer: str
    framework: str
    versions: str  # the range the facts hold for, with the version they were tested on
    layouts: Tuple[str, ...]  # inventory layouts this producer's units come as
    match_files: Tuple[str, ...] = ()
    match_keys: Tuple[str, ...] = ()
    files: Tuple[FileRole, ...] = ()
    keys: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    step_at: Tuple[str, ...] = ()
    epoch_at: Tuple[str, ...] = ()
    name_number: str = "step"
    saves: FrozenSet[str] = frozenset()
    never_saves: FrozenSet[str] = frozenset()


@dataclass(frozen=True)
class RestoreRule:
    """A rule of the producer's resume about a combination of components: it restores ``component`` only when
    every one of ``needs`` is in the unit too, and otherwise starts that component fresh, silently.  ``source``
    says where the rule is in the framework's code (file, function, the condition, and the versions read)."""

    component: str
    needs: Tuple[str, ...]
    source: str


@dataclass(frozen=True)
class CountRule:
    """A rule of the producer's resume about how many files of one kind a unit holds: the files whose base
    name matches ``pattern`` (a regular expression) must be one per ``counted`` (in words, singular: what the
    resuming job has, e.g. an object it registered), or the resume raises.  The audit takes that number
    from the run: what most of its units hold.  ``source``: where the rule is in the framework's code."""

    pattern: str
    counted: str
    source: str


@dataclass(frozen=True)
class RequiredKeys:
    """A rule of the producer's resume about the keys at the root of a file it loads: every one of ``keys``
    (``key -> what the resume does without it``, in words) is read unconditionally, so a file in the producer's
    format that lacks one cannot be resumed, whatever else it holds.  A file is in that format when its root holds
    at least ``min_format_keys`` of ``format_keys`` (the key names only that format uses together).  ``repair``:
    Python that writes a resumable copy (``{file}``: the file's run-relative path, ``{fixed}``: the copy's;
    ``{key}``: a missing key), run in the run folder; ``source``: where the resume reads the keys.  A file
    lacking every one of ``weights_only_without`` is the producer's weights-only save: its missing training
    state is told as such (``weights_only_checkpoint``), and only the other missing keys by this rule."""

    keys: Dict[str, str]
    format_keys: FrozenSet[str]
    min_format_keys: int
    source: str
    weights_only_without: FrozenSet[str] = frozenset()
    repair: Dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ResumeLoad:
    """How a producer's resume unpickles one file: ``loader`` in words, the names its loader adds to torch's
    weights-only allowlist (``allows``, as torch matches them), or no allowlist at all (``weights_only``
    False), or ``never`` (the resume does not unpickle the file).  Names in ``allows`` are judged as that
    loader's own in its files (:func:`ckptaudit.security.scan`), also where it loads without an allowlist
    (ultralytics' model classes, which its opt-in weights-only loader admits by name)."""

    loader: str
    allows: FrozenSet[str] = frozenset()
    weights_only: bool = True
    never: bool = False


@dataclass(frozen=True)
class PointerFile:
    """A file a producer writes beside its units to name one (DeepSpeed's ``latest``): its base ``name``, what
    it is in words (``kind``, the inventory's pointer kind), the unit name its text means (``target_unit``;
    the text itself when None) and ``check(pointer row, suggestion)`` → a finding or None, for a text
    the producer's resume cannot use (None: any text that names a unit is usable)."""

    name: str
    kind: str
    target_unit: Optional[Callable[[str], str]] = None
    check: Optional[Callable[[dict, str], object]] = None
    #: the text that names a unit (the inverse of ``target_unit``: Megatron's tracker holds ``30`` for
    #: ``iter_0000030``), for the repairs that rewrite the pointer; None: the unit's base name
    text_of: Optional[Callable[[str], str]] = None
    #: ``(pointer row, suggestion, its text) -> finding`` when the pointer names a usable unit older than the newest
    #: usable one and the producer's resume follows it (Megatron's tracker); None: ``latest_pointer_not_newest``
    behind: Optional[Callable[[dict, str, str], object]] = None


@dataclass(frozen=True)
class UnfinishedMarker:
    """A file a producer puts beside (or inside) a unit's folder before it saves (or deletes) it and removes once
    every rank is done, so that its own resume skips the unit while the file is there: ``path_of(unit)`` is the
    marker's run-relative path for a unit's run-relative path, or the paths where one would mark it (a marker inside
    a checkpoint folder marks every unit under that folder); ``why`` the unit's in-progress reason (``{marker}``:
    the marker's base name, ``{marker_path}`` its run-relative path)."""

    path_of: Callable[[str], Union[str, Tuple[str, ...]]]
    why: str

    def paths(self, unit: str) -> Tuple[str, ...]:
        """Where a marker of run-relative ``unit`` would be, run-relative."""
        got = self.path_of(unit)
        return (got,) if isinstance(got, str) else tuple(got)


#: ``default_pick(verdict, folder) -> (unit or None, whether the framework has a default resume)``
DefaultPick = Callable[[dict, str], Tuple[Optional[str], bool]]


@dataclass(frozen=True)
class Producer:
    """Everything the audit knows about one framework, keyed by the inventory ``layouts`` of its units.

    ``roles``: ``(role, regular expression on a file's base name)`` in the order a file takes the first
    that matches (``mixed`` when none does); ``resume_loads``: role → :class:`ResumeLoad`;
    ``resume_call``: the framework's own resume call for one unit (``{path}``, ``{dir}``, ``{tag}``, ``{step}``:
    :func:`ckptaudit.resume_hint.call`);
    ``default_call``: the call whose pick :attr:`default_pick` computes; ``contracts``: its version ranges;
    the producers with a ``resume_call`` are the frameworks whose resume the verdict words (the others are
    resumed by a script that names the file)."""

    key: str
    name: str  # in a sentence: "the HF Trainer", "DeepSpeed"
    layouts: Tuple[str, ...]
    contracts: Tuple[Contract, ...] = ()
    roles: Tuple[Tuple[str, str], ...] = ()
    resume_loads: Dict[str, ResumeLoad] = field(default_factory=dict)
    resume_call: Optional[str] = None
    default_call: Optional[str] = None
    default_pick: Optional[DefaultPick] = None
    #: ``(role, facts) -> role``: a role that depends on what the scan read (DeepSpeed ZeRO-3)
    adjust_role: Optional[Callable[[str, dict], str]] = None
    #: whether the framework resumes a unit of another layout as its own (Lightning: a plain ``.ckpt``)
    claims: Optional[Callable[[dict], bool]] = None
    #: the unit the framework's configured resume loads by name (Lightning's ``last.ckpt``), and that call
    entry: Optional[Callable[[str], bool]] = None
    entry_call: Optional[str] = None
    #: the name ending of this producer's file units ("" when any)
    unit_suffix: str = ""
    #: base-name patterns that make a folder this producer's own layout (its layout adapter claims it)
    claim_files: Tuple[str, ...] = ()
    #: unit kinds (``file``, ``folder``) of its layouts that ``safe_load_checkpoint`` loads itself
    reader_kinds: Tuple[str, ...] = ()
    #: files of its units that are not training state, never loaded by the reader: base name -> why
    not_state: Dict[str, str] = field(default_factory=dict)
    #: ``(file name, key)`` of the list of ``{"step", "loss"}`` rows its trainer logs into every unit
    loss_log: Optional[Tuple[str, str]] = None
    #: a file it writes into every unit as the save ends: a unit holding it is the producer's own full save
    complete_marker: str = ""
    #: the marker files it keeps beside or inside a unit while that unit's save or deletion runs: with one there, the
    #: unit is a save in progress and the marker no unit (:func:`ckptaudit.producers.unfinished_marker`)
    unfinished_markers: Tuple[UnfinishedMarker, ...] = ()
    #: ``(regular expression searched in a base name, why)``: the names it saves under and renames once the save
    #: is complete; a unit so named is a save in progress (:func:`ckptaudit.producers.in_progress_name`)
    in_progress_names: Tuple[Tuple[str, str], ...] = ()
    #: ``unit paths -> {unit: why}``: of a run's units (run-relative), those of a save that another of its ranks
    #: has not finished, which its resume never takes (:func:`ckptaudit.producers.incomplete_saves`)
    incomplete_saves: Optional[Callable[[Sequence[str]], Dict[str, str]]] = None
    #: ``{unit: usable_for} -> {unit: why}``: units its resume cannot take because a file of the same save that
    #: its resume loads with them (another rank's) is not usable (:func:`ckptaudit.producers.spoiled_saves`)
    spoiled_saves: Optional[Callable[[Dict[str, str]], Dict[str, str]]] = None
    #: a regular expression (full match) on a zip file's base name that makes the file this producer's own unit,
    #: of its first layout, as :attr:`unit_suffix` does by the name's ending
    unit_names: str = ""
    #: a regular expression whose group 1 is the step in its units' names, tried before the generic step patterns
    #: (:func:`ckptaudit.units.step_from_name`)
    name_step: str = ""
    #: what its resume adds to the number :attr:`name_step` reads (timm names a file by the epoch just trained and
    #: resumes at the next one: 1), so that a unit's name step and recorded step count the same thing
    name_step_offset: int = 0
    #: the name of the folder its file units sit in (ultralytics' ``weights/``); with it, :attr:`unit_names` makes a
    #: file this producer's unit only inside such a folder
    unit_folder: str = ""
    #: ``tree -> (step, where) or None``: the step its resume continues at, read from one file's scan tree (the
    #: pruned object of :mod:`ckptaudit.layouts.tree`), where no generic step key says it (an epoch-based resume:
    #: the saved epoch and what the resume adds to it); by layout, so it holds with the contracts off too
    resume_step: Optional[Callable[[dict], Optional[Tuple[int, str]]]] = None
    #: the prefixes its resume's own model wrapper puts on every weight key, which its load expects: such a prefix
    #: is no ``key_prefix_mismatch``
    model_prefixes: Tuple[str, ...] = ()
    #: pointer files it writes beside its units
    pointers: Tuple[PointerFile, ...] = ()
    #: keys at a checkpoint's root that record the version of this framework (key -> package)
    version_keys: Dict[str, str] = field(default_factory=dict)
    #: a version key's package name -> the distribution whose installed version compares with it
    version_dists: Dict[str, str] = field(default_factory=dict)
    #: modules its pickles import -> the pip package that installs them
    pip_names: Dict[str, str] = field(default_factory=dict)
    #: ``(unit, scan facts, target) -> findings``: the unit's parallel layout against the resuming job's
    parallel_findings: Optional[Callable[[str, dict, dict], list]] = None
    #: its own classes its checkpoints pickle that are data (rebuilt from constants, no code named by the
    #: pickle runs): ``module.name`` -> (the ``add_safe_globals`` spelling, why and where it was seen)
    benign_globals: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    #: the layout adapters that scan its folder units, ``(claim order, "module:ATTR")`` in
    #: :mod:`ckptaudit.layouts`: of all producers' adapters, the lowest order that claims a folder owns it
    folder_adapters: Tuple[Tuple[int, str], ...] = ()
    #: its index-file adapters (``"module:ATTR"`` in :mod:`ckptaudit.layouts`), which claim shards by an index
    index_adapters: Tuple[str, ...] = ()
    #: its resume's rules about combinations of components (:class:`RestoreRule`), for every version its
    #: module covers: structural (by layout), so they hold with the contracts off too
    restores_together: Tuple[RestoreRule, ...] = ()
    #: its resume's rules about how many files of a kind a unit must hold (:class:`CountRule`)
    file_counts: Tuple[CountRule, ...] = ()
    #: the keys its resume reads from every file it loads (:class:`RequiredKeys`), for files in its format
    required_keys: Optional[RequiredKeys] = None
