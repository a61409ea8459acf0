"""deploy/ with real components on loopback (docs/deploy.md): two `specula serve` replicas behind
Debian's nginx with the shipped configuration, specula-load through the proxy, a rolling restart
under load, a replica killed under load, Prometheus scraping both replicas with the shipped
configuration and rules, and the Kubernetes manifests validated with kubernetes-validate."""
import json
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from conftest import MAIN_JOB_ARGS, SOURCE_DIR, Server, free_port, wait_for
from test_load import PROMPTS, run_load

DEPLOY = SOURCE_DIR / "deploy"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PROMETHEUS = shutil.which("prometheus")
# The main job's drafting; a small KV pool and short replies keep the runs to seconds.
REPLICA_ARGS = [*MAIN_JOB_ARGS, "--max-batch", "16", "--max-queue", "64"]
LOAD_ARGS = ["--concurrency", 32, "--max-tokens", 12, "--temperature", 0.7, "--json", "--quiet"]


class Nginx:
    def __init__(self, run_dir: pathlib.Path, ports):
        assert pathlib.Path(NGINX).exists(), "nginx is missing: run scripts/setup.sh --tests"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        run_dir.mkdir(parents=True, exist_ok=True)
        servers = "".join(f"    server 127.0.0.1:{p} max_fails=2 fail_timeout=1s;\n" for p in ports)
        conf = (DEPLOY / "nginx" / "specula.conf.in").read_text()
        conf = conf.replace("@LISTEN@", f"127.0.0.1:{self.port}").replace("@RUN@", str(run_dir))
        conf = conf.replace("@SERVERS@\n", servers)
        (run_dir / "nginx.conf").write_text(conf)
        self.run_dir = run_dir
        self.proc = subprocess.Popen([NGINX, "-p", str(run_dir), "-c", str(run_dir / "nginx.conf"), "-g", "daemon off;"],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert wait_for(lambda: self._healthy(), timeout=20), self.log()

    def _healthy(self):
        assert self.proc.poll() is None, self.log()
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self):
        p = self.run_dir / "error.log"
        return p.read_text() if p.exists() else ""

    def stop(self):
        self.proc.send_signal(signal.SIGQUIT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Cluster:
    def __init__(self, tmp: pathlib.Path, n=2):
        self.tmp = tmp
        self.replicas = [Server(REPLICA_ARGS, tmp / f"replica{i}.log") for i in range(n)]
        self.nginx = Nginx(tmp / "nginx", [r.port for r in self.replicas])
        self.restarts = 0

    def restart(self, i, sig=signal.SIGTERM):
        """Stops replica i with `sig` and starts it again on the same port; returns the exit status."""
        old = self.replicas[i]
        code = old.stop(sig, timeout=60)
        self.restarts += 1
        self.replicas[i] = Server(REPLICA_ARGS, self.tmp / f"replica{i}.{self.restarts}.log", port=old.port)
        return code

    def stop(self):
        self.nginx.stop()
        for r in self.replicas:
            r.stop(signal.SIGKILL)

    def report(self, result=None, events=()):
        """What a failed deployment test needs to be understood: the times of the test's own
        actions and of the failed requests (the load tester's clock), which replicas still run,
        the tail of nginx's error log and of every replica's log."""
        lines = [f"events (s since the load started): {list(events)}"]
        if result is not None:
            def why(q):
                e = q.get("error") or {}
                return f'{e.get("kind")}: {str(e.get("message"))[:60]}'
            failed = [(round(q["start_ms"] / 1e3, 2) if q["start_ms"] is not None else None, why(q))
                      for q in result["requests"] if not q["ok"]]
            if failed:
                lines.append(f"{len(failed)} failed, first {failed[:3]}, last {failed[-3:]}")
        lines.append("replicas running: " + str([r.proc.poll() is None for r in self.replicas]))
        lines.append("nginx error.log (tail):\n" + "\n".join(self.nginx.log().splitlines()[-25:]))
        access = self.nginx.run_dir / "access.log"
        if access.exists():
            bad = [line for line in access.read_text().splitlines() if '" 200 ' not in line]
            lines.append(f"nginx access.log, {len(bad)} answers not 200 (first 5):\n" + "\n".join(bad[:5]))
        for log in sorted(self.tmp.glob("replica*.log")):
            lines.append(f"{log.name} (tail):\n" + "\n".join(log.read_text().splitlines()[-6:]))
        return "\n".join(lines)


def requests_counted(replica):
    m = replica.metrics()
    return sum(v for k, v in m.items() if k.startswith("specula_requests_total{") and "rejected" not in k)


def load_in_background(url, requests):
    out = {}

    def go():
        out["r"] = run_load("--url", url + "/v1/chat/completions", "--prompts", PROMPTS, "--requests", requests,
                            *LOAD_ARGS)
    t = threading.Thread(target=go)
    t.start()
    return t, out


def result_of(out):
    r = out["r"]
    result = json.loads(r.stdout)
    return r.returncode, result, result["summary"]


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


def test_32_sessions_through_nginx_are_all_answered_by_both_replicas_and_prometheus_counts_them(cluster, tmp_path):
    assert PROMETHEUS, "prometheus is missing: run scripts/setup.sh --tests (Debian's prometheus)"
    prom = None
    if PROMETHEUS:
        port = free_port()
        run = tmp_path / "prometheus"
        run.mkdir()
        targets = ", ".join(f'"127.0.0.1:{r.port}"' for r in cluster.replicas)
        conf = (DEPLOY / "prometheus" / "prometheus.yml.in").read_text().replace("@TARGETS@", targets)
        conf = conf.replace("scrape_interval: 5s", "scrape_interval: 1s")
        (run / "prometheus.yml").write_text(conf)
        shutil.copy(DEPLOY / "prometheus" / "specula_rules.yml", run)
        prom = subprocess.Popen([PROMETHEUS, f"--config.file={run / 'prometheus.yml'}", f"--storage.tsdb.path={run / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                stderr=open(run / "prometheus.log", "w"))
        prom_url = f"http://127.0.0.1:{port}"
    try:
        r = run_load("--url", cluster.nginx.url + "/v1/chat/completions", "--prompts", PROMPTS, "--requests", 96,
                     *LOAD_ARGS)
        assert r.returncode == 0, r.stderr[-2000:]
        s = json.loads(r.stdout)["summary"]
        assert (s["succeeded"], s["failed"]) == (96, 0), s["errors_by_kind"]
        counts = [requests_counted(rep) for rep in cluster.replicas]
        assert sum(counts) == 96 and min(counts) > 0, counts  # both replicas served, nothing twice
        tokens = sum(rep.metrics()["specula_generation_tokens_total"] for rep in cluster.replicas)
        assert tokens == s["output_tokens"], (tokens, s["output_tokens"])
        if prom is not None:
            def query():
                try:
                    res = httpx.get(prom_url + "/api/v1/query", params={"query": "sum(specula_generation_tokens_total)"},
                                    timeout=5).json()["data"]["result"]
                    return float(res[0]["value"][1]) if res else None
                except (httpx.HTTPError, KeyError, ValueError):
                    return None
            assert wait_for(lambda: query() == s["output_tokens"], timeout=30), (query(), s["output_tokens"])
            up = httpx.get(prom_url + "/api/v1/query", params={"query": "sum(up{job='specula'})"}, timeout=5).json()
            assert float(up["data"]["result"][0]["value"][1]) == 2
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(10)


def test_a_rolling_restart_under_load_loses_no_request(cluster):
    t0 = time.monotonic()
    t, out = load_in_background(cluster.nginx.url, 320)
    time.sleep(1.0)
    codes, events = [], []

    def mark(what):
        events.append((what, round(time.monotonic() - t0, 2)))
    for i in range(len(cluster.replicas)):
        # One at a time: it drains and exits, starts again on its port, answers /health; then the
        # next goes once nginx sends it traffic again: it has answered a request through the
        # proxy. nginx re-admits a failed server one request at a time and counts it live only when
        # that request ends, a generation's length after /health is 200 (docs/deploy.md).
        mark(f"SIGTERM {i}")
        codes.append(cluster.restart(i, signal.SIGTERM))
        mark(f"healthy {i}")
        assert wait_for(lambda: requests_counted(cluster.replicas[i]) > 0 or not t.is_alive(), timeout=60,
                        interval=0.2), cluster.report(None, events)
        mark(f"serving {i}")
    t.join(600)
    code, result, s = result_of(out)
    assert codes == [0, 0], codes
    assert s["failed"] == 0 and code == 0, (s["errors_by_kind"], cluster.report(result, events))
    assert s["succeeded"] == 320
    assert all(r.proc.poll() is None for r in cluster.replicas), cluster.report(result, events)


def test_a_killed_replica_fails_only_what_it_held_and_new_requests_go_to_the_survivor(cluster):
    t, out = load_in_background(cluster.nginx.url, 320)
    time.sleep(1.5)
    victim = cluster.replicas[0]
    killed_at = time.monotonic()
    victim.proc.kill()
    victim.proc.wait()
    t.join(600)
    code, result, s = result_of(out)
    # The load tester's clock starts at its first request; the kill is placed on it by the
    # requests that were running then.
    failed = [q for q in result["requests"] if not q["ok"]]
    report = {"failed": len(failed), "kinds": s["errors_by_kind"]}
    print("crash report:", json.dumps(report))
    assert s["succeeded"] + s["failed"] == 320
    assert len(failed) <= 32, report  # at most the requests in flight on it (16 batch + queue share)
    for q in failed:
        assert q.get("error"), q  # each failure says why
    if failed:
        last_failure = max(q["start_ms"] for q in failed)
        # Requests sent more than a few seconds after the first failure all succeeded.
        late = [q for q in result["requests"] if q["start_ms"] > last_failure + 3000]
        assert late and all(q["ok"] for q in late), report
    assert cluster.replicas[1].proc.poll() is None


def test_a_chat_sending_a_session_header_stays_on_one_replica_whose_prefix_cache_holds_its_history(cluster):
    """Affinity by X-Session-Id (deploy/nginx/specula.conf.in): every turn of a session goes to
    one replica, so each later turn finds the whole history before it in that replica's prefix
    cache (each session's system prompt is its own, so the other replica could not have it);
    sessions spread over both replicas; and a session whose replica is killed is served by the
    survivor."""
    sessions = [f"visitor-{i}" for i in range(12)]
    questions = ["What is an escapement?", "Who made the first one?", "And what came after it?"]
    with httpx.Client(base_url=cluster.nginx.url, timeout=120) as client:
        def turn(sid, messages):
            r = client.post("/v1/chat/completions", headers={"X-Session-Id": sid},
                            json={"messages": messages, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, (sid, r.text, cluster.report())
            return r.json()
        histories = {}
        for i, sid in enumerate(sessions):
            messages = [{"role": "system", "content":
                         f"This is visitor number {i * 7919 % 1000} of the museum of clocks. Answer the visitor's "
                         "questions about the collection in short paragraphs, name the clockmakers where you know "
                         "them, and say so when you do not know something rather than guessing."}]
            for t, q in enumerate(questions):
                messages.append({"role": "user", "content": q})
                body = turn(sid, messages)
                usage = body["usage"]
                if t > 0:
                    # Everything but the head's last 32 rows, a partial block and the end of the
                    # re-tokenized reply (docs/engine.md, "The prefix cache").
                    cached = usage["prompt_tokens_details"]["cached_tokens"]
                    assert cached >= usage["prompt_tokens"] - 33 - 16 - 8, (sid, t, usage, cluster.report())
                messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            histories[sid] = messages

        upstreams = {}
        for line in (cluster.nginx.run_dir / "access.log").read_text().splitlines():
            if "POST /v1/chat/completions" not in line or " session=visitor-" not in line:
                continue
            sid = line.split(" session=")[1].split()[0]
            upstreams.setdefault(sid, set()).add(line.split(" upstream=")[1].split()[0])
        assert sorted(upstreams) == sorted(sessions), upstreams
        assert all(len(u) == 1 for u in upstreams.values()), upstreams  # one replica per session
        used = {next(iter(u)) for u in upstreams.values()}
        assert used == {f"127.0.0.1:{r.port}" for r in cluster.replicas}, upstreams  # both replicas

        victim = next(r for r in cluster.replicas if f"127.0.0.1:{r.port}" in upstreams[sessions[0]])
        victim.proc.kill()
        victim.proc.wait()
        messages = histories[sessions[0]] + [{"role": "user", "content": "Thank you!"}]
        assert turn(sessions[0], messages)["choices"][0]["message"]["content"]


def test_the_kubernetes_manifests_validate(tmp_path):
    tool = pathlib.Path(sys.executable).parent / "kubernetes-validate"  # the test venv's
    assert tool.exists(), f"{tool} is missing: run scripts/setup.sh --tests"
    r = subprocess.run([str(tool), "--strict", str(DEPLOY / "k8s" / "specula.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind in ("deployment/specula", "service/specula", "horizontalpodautoscaler/specula"):
        assert f"passed for resource {kind}" in r.stdout + r.stderr, r.stdout + r.stderr
    # And it can fail (the controls): a typo in a field name, a Deployment without its selector.
    text = (DEPLOY / "k8s" / "specula.yaml").read_text()
    for name, bad in [("typo", text.replace("readinessProbe:", "readinesProbe:", 1)),
                      ("no selector", text.replace("  selector:\n    matchLabels: {app: specula}\n", "", 1))]:
        assert bad != text, name
        (tmp_path / "bad.yaml").write_text(bad)
        r = subprocess.run([str(tool), "--strict", str(tmp_path / "bad.yaml")], capture_output=True, text=True)
        assert r.returncode != 0, f"{name}: {r.stdout + r.stderr}"
