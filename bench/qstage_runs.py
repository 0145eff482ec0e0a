"""What the tensor-network bench scripts share: a workflow spec written from a list of steps,
`qstage run` of it (with a timeout that kills the whole process group), the attributes of an
output file, and a path's SSA pairs as the linear (opt_einsum) form the peers take."""
import json
import os
import signal
import subprocess
import sys


def spec_text(name, steps):
    """steps: [(id, stage, inputs dict or None, params dict)] as a workflow spec's YAML."""
    lines = [f"name: {name}", "steps:"]
    for sid, stage, inputs, params in steps:
        lines += [f"  - id: {sid}", f"    stage: {stage}"]
        if inputs:
            lines.append(f"    inputs: {json.dumps(inputs)}")
        lines.append(f"    params: {json.dumps(params)}")
    return "\n".join(lines) + "\n"


def run_with_timeout(cmd, env, timeout, grace=None):
    """subprocess.run(cmd, capture_output=True, text=True) in a process group of its own, which is
    killed whole when `timeout` passes (cotengra's pool workers outlived their parent otherwise,
    and ran beside the next cases' searches). Raises subprocess.TimeoutExpired as run does; with
    `grace` seconds, the command is first sent SIGTERM and what it prints by then is returned."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if grace:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace)  # (its pool's workers hold the pipes open: they go now)
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                out, err = p.communicate()
                return subprocess.CompletedProcess(cmd, p.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise
    finally:
        try:  # stray children of a finished job too
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def run_spec(qstage, text, run_dir, device, device_memory=None, env=None, timeout=None):
    """Writes `text` beside run_dir (run_dir.yaml) and runs it there; exits with qstage's stderr
    if it fails; returns its stderr. Raises subprocess.TimeoutExpired past `timeout` seconds."""
    spec = run_dir.parent / (run_dir.name + ".yaml")
    spec.write_text(text)
    cmd = [qstage, "run", str(spec), "--run-dir", str(run_dir), "--device", device]
    if device_memory:
        cmd += ["--device-memory", device_memory]
    r = run_with_timeout(cmd, env, timeout)
    if r.returncode != 0:
        sys.exit(f"qstage failed ({r.returncode}) on {spec}:\n{r.stderr[-3000:]}")
    return r.stderr


def h5attrs(path):
    import h5py
    with h5py.File(path) as f:
        return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}


def ssa_to_linear(ssa, n):
    """SSA pairs (each result a new id n, n + 1, ...) as positions in the shrinking operand list."""
    ids, linear, nxt = list(range(n)), [], n
    for a, b in ssa:
        i, j = ids.index(a), ids.index(b)
        linear.append((i, j))
        for k in sorted((i, j), reverse=True):
            del ids[k]
        ids.append(nxt)
        nxt += 1
    return linear
