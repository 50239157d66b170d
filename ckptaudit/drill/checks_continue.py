"""The drill's checks of training on from the unit: loss at restore, continuation, LR schedule, next unit."""

from __future__ import annotations

import math
from typing import Any, Dict, Mapping, Optional, Tuple

from .checks_restore import as_float, same_values
from .contract import import_hook
from .handover import counter


class ContinueChecks:
    """Checks that continue training from the restored state (mixed into the child's ``Child``).

    Each returns (status, expected, actual, message); updates are appended to ``self.result["trace"]``."""

    r: Any
    spec: Mapping[str, Any]
    torch: Any
    result: Dict[str, Any]
    rng_ok: bool
    sched_epoch_at_restore: Optional[int]
    #: the hook's optimizer and scheduler as handed over (:func:`.handover.take`); None: not taken, the
    #: scheduler's state is then not compared with the unit's
    handed: Any = None

    def flush(self) -> None:  # the child's
        raise NotImplementedError

    def c_loss(self):
        torch = self.torch
        rec = self.r.saved.get("loss")
        src = self.r.saved.get("loss_source") or "loss"
        tol = float(self.spec["loss_tolerance"])
        dev = torch.device(self.spec["device"])
        devs = [dev.index or 0] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=devs):
            val = as_float(self.r.eval_loss(self.r.loss_batch))
        if not math.isfinite(val):
            return "fail", "a finite loss", f"{val}", f"the loss on the fixed batch is {val}"
        if rec is None:
            return "warn", "a recorded loss", f"{val:.4f}", "the unit records no loss; nothing to compare with"
        rec = float(rec)
        rel = abs(val - rec) / max(abs(rec), 1e-12)
        exp = f"{rec:.4f} ({src}) ± {tol:.0%}"
        act = f"{val:.4f} ({rel:.1%} off)"
        if rel > tol:
            return ("fail", exp, act, f"the loss on the fixed batch after restore is {val:.4f} but the run recorded "
                    f"{rec:.4f} ({src}): {rel:.1%} off, over drill.loss_tolerance {tol:g} — the weights are not "
                    "the ones that produced the recorded loss")
        return "pass", exp, act, f"loss at restore matches the recorded {src}"

    def _one_step(self, gstep: int) -> dict:
        opt = self.r.optimizer
        lr = [float(g["lr"]) for g in opt.param_groups]
        sch = self.r.scheduler
        epoch = counter(sch) if sch is not None else None
        batch = next(self.r.batches)
        loss, gn = self.r.train_step(batch)
        e = {"step": gstep, "lr": lr, "loss": as_float(loss), "grad_norm": as_float(gn), "scheduler_last_epoch": epoch}
        lr_at = getattr(self.r, "lr_at", None)
        if callable(lr_at):  # the schedule's LR for the same step, drawn beside the LR used in drill.html
            try:
                e["lr_schedule"] = [float(x) for x in lr_at(gstep)]
            except Exception:  # noqa: BLE001 - c_lr calls lr_at again and reports the error as a check result
                pass
        self.result["trace"].append(e)
        return e

    def c_continue(self):
        k = int(self.spec["steps"])
        s0 = int(self.r.step)
        bad = []
        for i in range(k):
            e = self._one_step(s0 + i)
            if not (math.isfinite(e["loss"]) and math.isfinite(e["grad_norm"])):
                bad.append(f"step {s0 + i + 1}: loss {e['loss']}, grad norm {e['grad_norm']}")
        self.flush()
        tr = self.result["trace"]
        exp = f"{k} updates with finite loss and gradient norm"
        gmax = max(e["grad_norm"] for e in tr)
        act = f"loss {tr[0]['loss']:.4f} → {tr[-1]['loss']:.4f}, grad norm ≤ {gmax:.3g}"
        if bad:
            return "fail", exp, act, "non-finite values while continuing: " + "; ".join(bad[:3])
        return "pass", exp, act, f"{k} updates from step {s0} ran"

    def c_lr(self):
        """The LR the job trains with: the continuation's LRs against the schedule (``lr_at``), the scheduler's
        state as handed over against the unit's (:mod:`.handover`), and the restored scheduler stepped ahead
        through the schedule's next change (:mod:`.lr_horizon`).  ``skip`` where none of these can judge."""
        tr = self.result["trace"]
        lr_at = getattr(self.r, "lr_at", None)
        s0 = int(self.r.step)
        saved_sched = self.r.saved.get("scheduler")
        sch = self.r.scheduler
        note = ""
        if saved_sched is None and sch is not None:
            note = " The unit holds no scheduler state, so the resume code built a fresh scheduler."
        if callable(lr_at):
            bad = self._lr_trace_mismatch(lr_at, tr, s0, note)
            if bad is not None:
                return bad
        state = self._sched_state(saved_sched)
        if state[0] == "fail":
            return state
        if not callable(lr_at):
            return self._lr_without_schedule(tr, s0, saved_sched, state, note)
        ahead, horizon = self._lr_ahead(lr_at, tr, note)
        if ahead is not None:
            return ahead
        exp = f"schedule LR for steps {tr[0]['step']}…{tr[-1]['step']}"
        act = f"LR {tr[0]['lr']} … {tr[-1]['lr']}"
        base = f"the LR continues the schedule from step {s0} (no re-warm-up)"
        if sch is None:
            return "pass", exp, act, base
        if horizon is not None:
            far = ", through its next change" if horizon.why.startswith("through its next change") else \
                f", {horizon.why}"
            return "pass", exp, act, base + far
        if state[0] == "pass":
            return "pass", exp, act, f"{base}; {state[1]}; {self._why_no_look_ahead(tr)}"
        return ("skip", exp, act, f"the {len(tr)} continuation LRs follow the schedule, but nothing shows the "
                f"scheduler continues past them: {self._why_no_look_ahead(tr)}, and {state[1]}." + note)

    def _lr_trace_mismatch(self, lr_at, tr, s0: int, note: str):
        """A failing result at the first continuation update whose LR is not ``lr_at``'s; None when all match."""
        for e in tr:
            want = [float(x) for x in lr_at(e["step"])]
            if len(want) != len(e["lr"]) or any(not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15)
                                                for a, b in zip(e["lr"], want)):
                rewarm = all(a < b for a, b in zip(e["lr"], want))
                return ("fail", f"LR {want} at step {e['step']} (the schedule)", f"LR {e['lr']}",
                        f"the update after step {e['step']} used LR {e['lr']} but the schedule gives {want}"
                        + (" — the learning rate re-warms" if rewarm else "")
                        + (f"; scheduler last_epoch was {self.sched_epoch_at_restore} at restore, step {s0}"
                           if self.sched_epoch_at_restore is not None else "") + "." + note)
        return None

    def _sched_state(self, saved_sched) -> Tuple[str, str, str, str]:
        """The scheduler's state as the hook handed it over against the unit's: ``("fail", expected, actual,
        message)`` when a counter (or another numeric entry) differs or the job dropped the unit's scheduler;
        ``("pass", what was compared, "", "")`` when they agree; ``("skip", why not compared, "", "")``."""
        from . import handover

        sch, h = self.r.scheduler, self.handed
        if saved_sched is None:
            return "skip", "the unit holds no scheduler state to compare the counters with", "", ""
        if sch is None:
            return ("fail", "a scheduler continuing the unit's", "no scheduler",
                    "the unit holds scheduler state but the restored job has no scheduler: the LR stays where it "
                    "was saved instead of following the schedule")
        if h is None:
            return "skip", "no snapshot of the scheduler as handed over", "", ""
        if h.scheduler_state is None:
            return "skip", h.scheduler_error or "the scheduler gives no state_dict", "", ""
        if not isinstance(saved_sched, Mapping) or not handover.counters_in(saved_sched):
            return "skip", f"the unit's scheduler state ({type(saved_sched).__name__}) holds no counter to compare", \
                "", ""
        diffs = handover.state_differences(h.scheduler_state, saved_sched)
        if diffs:
            return ("fail", "the scheduler's state as saved", f"{len(diffs)} entr{'y' if len(diffs) == 1 else 'ies'} "
                    "differ", f"the scheduler the resume code hands over does not continue the unit's: "
                    f"{'; '.join(diffs[:4])}{' …' if len(diffs) > 4 else ''} — it was rebuilt or not loaded, so "
                    f"it changes the LR at other steps than the run did (and saves that counter onward)")
        return "pass", f"its state equals the unit's ({type(sch).__name__}: counters and base LRs)", "", ""

    def _why_no_look_ahead(self, tr) -> str:
        """Why the restored scheduler was not stepped ahead (:meth:`_lr_ahead` returned no horizon)."""
        from .handover import counter

        if counter(self.r.scheduler) is None:
            return (f"the look-ahead needs a step counter and {type(self.r.scheduler).__name__} keeps none "
                    "(last_epoch, _step_count, or its children's)")
        epochs = [e.get("scheduler_last_epoch") for e in tr]
        return (f"its counter went {epochs[0]}…{epochs[-1]} over {len(tr)} updates, not one step per update "
                "(stepped per epoch?), so it was judged by its counters, not stepped ahead")

    def _lr_without_schedule(self, tr, s0: int, saved_sched, state, note: str):
        """``lr_continuity`` when the hook gives no ``lr_at``: the first LR against the saved one, and the
        scheduler's state against the unit's."""
        want = [float(g["lr"]) for g in (self.r.saved.get("optimizer") or {}).get("param_groups", [])]
        first = tr[0]["lr"]
        if want and any(not math.isclose(a, b, rel_tol=1e-6) for a, b in zip(first, want)):
            return ("fail", f"saved LR {want}", f"LR {first}",
                    f"the first update after restore used LR {first} but the run saved {want}." + note)
        if saved_sched is not None and self.r.scheduler is not None:
            if state[0] == "skip" and self.handed is None:  # no snapshot: the counter at restore, as recorded
                sv = saved_sched.get("last_epoch") if isinstance(saved_sched, Mapping) else None
                if sv is not None and self.sched_epoch_at_restore != sv:
                    return ("fail", f"scheduler last_epoch {sv}", f"last_epoch {self.sched_epoch_at_restore}",
                            "the scheduler's counter does not continue from the saved one")
            cur = getattr(self.r.scheduler, "last_epoch", None)
            if state[0] == "skip" and self.handed is not None:
                return ("skip", f"saved LR {want}", f"LR {first}, scheduler {type(self.r.scheduler).__name__}",
                        f"the first LR is the saved one, but nothing shows the scheduler continues: the hook gives "
                        f"no lr_at(step) and {state[1]}")
            return ("warn", f"saved LR {want}", f"LR {first}, scheduler last_epoch {cur}",
                    "the hook gives no lr_at(step); only the first LR and the scheduler's state were compared")
        if saved_sched is None and self.r.scheduler is not None:
            return ("fail", f"scheduler state at step {s0}", "a fresh scheduler",
                    "the unit holds no scheduler state and the hook gives no lr_at(step) to prove the schedule "
                    "continues; a rebuilt scheduler starts from step 0 (re-warm-up)." + note)
        return "pass", f"saved LR {want}", f"LR {first}", "constant LR (no scheduler) continues"

    def _lr_ahead(self, lr_at, tr, note: str):
        """``(failing result, None)`` when the restored scheduler, stepped ahead past the trace, departs from
        ``lr_at`` before or at the schedule's next change (:mod:`.lr_horizon`); ``(None, Horizon)`` when it
        follows it; ``(None, None)`` when it cannot be stepped ahead (no scheduler, or not one step per update)."""
        from . import lr_horizon

        sch = self.r.scheduler
        if sch is None or not lr_horizon.per_step(tr):
            return None, None
        seen: list = []
        got = lr_horizon.mismatch(sch, self.r.optimizer, lr_at, tr[-1]["step"] + 1, seen)
        if got is None:
            return None, (seen[0] if seen else None)
        have = f"LR {got.got}" if isinstance(got.got, list) else f"step() raised {got.got}"
        return ("fail", f"LR {got.want} at step {got.step} (the schedule)", f"{have} from the restored scheduler",
                f"the LRs of the continuation match, but stepped ahead the restored scheduler gives {have} at step "
                f"{got.step} where the schedule gives {got.want}: its counter was {self.sched_epoch_at_restore} at "
                f"restore, step {int(self.r.step)}, so it changes the LR at the wrong steps." + note), None

    def c_next(self):
        sp = self.spec
        if not sp.get("next_path"):
            return "skip", "", "", "no later intact unit to compare the continuation with"
        s0 = int(self.r.step)
        n_step = sp.get("next_step")
        if n_step is None or int(n_step) <= s0:
            return "skip", "", "", f"{sp['next_unit']}: its step is unknown or not after {s0}"
        gap = int(n_step) - s0
        reasons = self._not_exact(gap)
        exact = not reasons
        if exact:
            for i in range(len(self.result["trace"]), gap):
                self._one_step(s0 + i)
            self.flush()
        done = len(self.result["trace"])
        cur = {n: t.detach() for n, t in self.r.model.state_dict().items()}
        # free what the comparison does not need before loading the next unit
        self.r.optimizer.state.clear()
        nsaved = import_hook(sp["hook"])(sp["next_path"], "cpu").saved
        ref, ref_loss, ref_src = nsaved.get("model") or {}, nsaved.get("loss"), nsaved.get("loss_source") or "loss"
        del nsaved
        if exact:
            return self._bitwise(cur, ref, ref_loss, ref_src, s0, int(n_step), gap)
        return _in_norm(cur, ref, sp, done, "; ".join(reasons))

    def _not_exact(self, gap: int) -> list:
        """Why the continuation cannot be compared bit for bit with the next unit, ``gap`` steps on."""
        sp, k = self.spec, int(self.spec["steps"])
        reasons = []
        if not bool(getattr(self.r, "deterministic", False)):
            reasons.append("the hook does not declare this device deterministic")
        if not self.rng_ok:
            reasons.append("the RNG state was not restored")
        if gap > int(sp["compare_max_steps"]):
            reasons.append(f"the next unit is {gap} steps away (> drill.compare_max_steps {sp['compare_max_steps']})")
        if gap < k:
            reasons.append(f"the next unit is only {gap} steps away (< drill.steps {k})")
        return reasons

    def _bitwise(self, cur: dict, ref: dict, ref_loss, ref_src: str, s0: int, n_step: int, gap: int):
        """Every weight after ``gap`` updates from step ``s0`` equal to the next unit's (step ``n_step``)."""
        sp = self.spec
        diffs = []
        for n, t in cur.items():
            if n not in ref:
                diffs.append(f"{n!r} missing in {sp['next_unit']}")
            elif same_values(t, ref[n]) is not None:
                a, b = t.cpu().double(), ref[n].cpu().double()
                md = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
                diffs.append(f"{n!r} (max |Δ| {md:.3g})")
        exp = f"weights bitwise equal to {sp['next_unit']} after {gap} updates"
        if diffs:
            return ("fail", exp, f"{len(diffs)} of {len(cur)} tensors differ",
                    f"continuing from step {s0} to {n_step} did not reproduce {sp['next_unit']}: "
                    f"{', '.join(diffs[:4])} — the restore is not faithful (or the run is not deterministic)")
        rec, last = ref_loss, self.result["trace"][-1]["loss"]
        lt = (f"; the last update's loss is {last:.6g}, {sp['next_unit']} recorded {rec:.6g} ({ref_src})"
              if rec is not None else "")
        return ("pass", exp, f"all {len(cur)} tensors equal",
                f"bit-exact: continuing reproduces {sp['next_unit']}{lt}")


def _in_norm(cur: dict, ref: dict, sp: Mapping[str, Any], done: int, why: str):
    """The weights after ``done`` updates finite and within ``drill.norm_tolerance`` of the next unit's norm
    (the check when a bitwise comparison cannot hold, for ``why``)."""

    def norm(sd):
        return math.sqrt(sum(float(t.detach().cpu().double().pow(2).sum()) for t in sd.values()
                             if t.is_floating_point()))

    a, b = norm(cur), norm(ref)
    tol = float(sp["norm_tolerance"])
    rel = abs(a - b) / max(b, 1e-12)
    exp = f"finite and within {tol:.0%} of {sp['next_unit']}'s weight norm {b:.4g}"
    act = f"norm {a:.4g} after {done} updates ({rel:.2%} off)"
    if not (math.isfinite(a) and math.isfinite(b)):
        return "fail", exp, act, "non-finite weights after continuing"
    if rel > tol:
        return ("fail", exp, act, f"after {done} updates the weight norm is {a:.4g}, {rel:.1%} from "
                f"{sp['next_unit']}'s {b:.4g} (compared in norm only: {why})")
    return "pass", exp, act, f"finite and close in norm (not compared bit for bit: {why})"
