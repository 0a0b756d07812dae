//! Checks of `deploy/kubernetes/`: every manifest validates against the Kubernetes API's
//! OpenAPI schemas (`kubernetes-validate`, strict, which `scripts/test` installs), the two
//! custom resources (Prometheus Operator) are checked here by hand, and the references between
//! the files hold: selectors find their pods, ports and port names exist where they are used,
//! the ConfigMap is a config the gateway accepts and agrees with the pod (ports, drain times
//! against `terminationGracePeriodSeconds`, memory against the limits, replicas), the probes'
//! paths answer on the ports they name when the ConfigMap's config runs, the alert rules are
//! `deploy/prometheus/alerts.yml`'s, and every Secret the pods read is in the set-up commands.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Reads YAML files as JSON through Python's PyYAML (installed with `kubernetes-validate` in
/// the test environment): `{file: [document, ...]}`.
fn yaml_files(files: &[PathBuf]) -> BTreeMap<String, Vec<Value>> {
    const SCRIPT: &str = "import json, sys, yaml\n\
        out = {}\n\
        for f in sys.argv[1:]:\n\
        \x20   with open(f) as h:\n\
        \x20       out[f] = [d for d in yaml.safe_load_all(h) if d is not None]\n\
        json.dump(out, sys.stdout)\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .args(files)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "reading YAML needs python3 with PyYAML (scripts/test installs it with \
         kubernetes-validate): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let parsed: BTreeMap<String, Vec<Value>> = serde_json::from_slice(&out.stdout).unwrap();
    parsed
        .into_iter()
        .map(|(f, docs)| {
            let name = PathBuf::from(f)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, docs)
        })
        .collect()
}

/// Every `*.yaml` directly in `deploy/kubernetes/`.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The objects of the deployment (every manifest but the kustomization), with their file.
struct Objects(Vec<(String, Value)>);

impl Objects {
    fn load() -> Self {
        let files = yaml_files(&manifest_files());
        Objects(
            files
                .into_iter()
                .filter(|(f, _)| f != "kustomization.yaml")
                .flat_map(|(f, docs)| docs.into_iter().map(move |d| (f.clone(), d)))
                .collect(),
        )
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.0
            .iter()
            .map(|(_, d)| d)
            .filter(move |d| d["kind"] == kind)
    }

    fn get<'a>(&'a self, kind: &'a str, name: &str) -> &'a Value {
        self.of_kind(kind)
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} named {name}"))
    }

    /// The pod templates (Deployments and StatefulSets), by workload name.
    fn workloads(&self) -> Vec<(&str, &Value)> {
        self.of_kind("Deployment")
            .chain(self.of_kind("StatefulSet"))
            .map(|w| (w["metadata"]["name"].as_str().unwrap(), w))
            .collect()
    }

    /// The workloads whose pods `selector` (a `matchLabels`-style map) selects.
    fn selected(&self, selector: &Value) -> Vec<&str> {
        self.workloads()
            .into_iter()
            .filter(|(_, w)| selects(selector, &w["spec"]["template"]["metadata"]["labels"]))
            .map(|(name, _)| name)
            .collect()
    }

    /// The gateway's Deployment, its pod spec and its container.
    fn gateway(&self) -> (&Value, &Value, &Value) {
        let d = self.get("Deployment", "tutor-gateway");
        let pod = &d["spec"]["template"]["spec"];
        (d, pod, container(pod, "gateway"))
    }
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// Whether every label of `selector` is on `labels` (an empty selector selects everything).
fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .map(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
        .unwrap_or(false)
}

/// The container port named or numbered `port` in the containers of `pod`.
fn container_port(pod: &Value, port: &Value) -> Option<u64> {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .find(|p| match port {
            Value::String(name) => p["name"] == name.as_str(),
            Value::Number(n) => p["containerPort"].as_u64() == n.as_u64(),
            _ => false,
        })
        .and_then(|p| p["containerPort"].as_u64())
}

/// The ConfigMap's `config.toml`, as text and as a TOML table.
fn gateway_config(objects: &Objects) -> (String, toml::Table) {
    let text = objects.get("ConfigMap", "tutor-gateway-config")["data"]["config.toml"]
        .as_str()
        .expect("the ConfigMap holds config.toml")
        .to_owned();
    let table = text.parse::<toml::Table>().expect("config.toml is TOML");
    (text, table)
}

fn toml_u64(table: &toml::Table, section: &str, key: &str) -> Option<u64> {
    let t = if section.is_empty() {
        table
    } else {
        table.get(section)?.as_table()?
    };
    t.get(key)?.as_integer().map(|v| v as u64)
}

fn toml_str<'a>(table: &'a toml::Table, section: &str, key: &str) -> &'a str {
    let t = if section.is_empty() {
        table
    } else {
        table[section].as_table().unwrap()
    };
    t.get(key)
        .and_then(|v| v.as_str())
        .unwrap_or_else(|| panic!("config.toml sets {section}.{key}"))
}

/// The port of an `IP:PORT` or `scheme://host:port/...` address.
fn port_of(addr: &str) -> u64 {
    let rest = addr.split("://").last().unwrap();
    let authority = rest.split('/').next().unwrap();
    authority.rsplit(':').next().unwrap().parse().unwrap()
}

fn host_of(url: &str) -> &str {
    let rest = url.split("://").nth(1).unwrap();
    let authority = rest.split('/').next().unwrap();
    let host_port = authority.rsplit('@').next().unwrap();
    host_port.split(':').next().unwrap()
}

/// Kubernetes quantities as bytes (`Mi`, `Gi`, or plain bytes).
fn bytes(quantity: &str) -> u64 {
    let (n, unit) = quantity.split_at(
        quantity
            .find(|c: char| c.is_alphabetic())
            .unwrap_or(quantity.len()),
    );
    let n: u64 = n.parse().unwrap();
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => panic!("unit {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// schemas

/// Runs `kubernetes-validate --strict` (at the oldest Kubernetes the manifests support and at
/// the newest the tool knows) over every manifest. A kind without a schema is only a warning
/// there, so a mistyped `apiVersion` would pass unseen: only the kustomization and the two
/// Prometheus Operator kinds may go without one.
#[test]
fn every_manifest_validates_against_the_kubernetes_api_schemas() {
    for version in [Some("1.30.0"), None] {
        let mut cmd = Command::new("kubernetes-validate");
        cmd.arg("--strict");
        if let Some(v) = version {
            cmd.args(["-k", v]);
        }
        let out = match cmd.args(manifest_files()).current_dir(dir()).output() {
            Ok(out) => out,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "kubernetes-validate is not installed (not on PATH). Run `scripts/test`, which \
                 installs it (PyPI package kubernetes-validate, into target/test-venv)."
            ),
            Err(e) => panic!("cannot run kubernetes-validate: {e}"),
        };
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubernetes {version:?}:\n{text}");
        for line in text.lines().filter(|l| l.contains("Couldn't find schema")) {
            assert!(
                [
                    "kind Kustomization ",
                    "kind ServiceMonitor ",
                    "kind PrometheusRule "
                ]
                .iter()
                .any(|k| line.contains(k)),
                "a manifest kind went unvalidated: {line}"
            );
        }
    }
}

/// `kubectl apply -k` applies exactly the files listed: each manifest is listed once, and each
/// listed file exists.
#[test]
fn the_kustomization_lists_every_manifest() {
    let files = yaml_files(&[dir().join("kustomization.yaml")]);
    let k = &files["kustomization.yaml"][0];
    let listed: Vec<&str> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    let listed_set: BTreeSet<&str> = listed.iter().copied().collect();
    assert_eq!(listed.len(), listed_set.len(), "listed twice: {listed:?}");
    let present: BTreeSet<String> = manifest_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|f| f != "kustomization.yaml")
        .collect();
    let listed_owned: BTreeSet<String> = listed_set.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed_owned, present, "kustomization.yaml's resources");
    assert_eq!(k["namespace"], "tutor");
    let objects = Objects::load();
    let ns = objects.get("Namespace", "tutor");
    assert_eq!(ns["metadata"]["name"], k["namespace"]);
}

// ---------------------------------------------------------------------------------------------
// selectors and ports

/// Every workload's selector selects its own pods; every Service, the PDB, the topology spread
/// and every NetworkPolicy find exactly the pods they are meant for.
#[test]
fn selectors_find_their_pods() {
    let objects = Objects::load();
    for (name, w) in objects.workloads() {
        assert!(
            selects(
                &w["spec"]["selector"]["matchLabels"],
                &w["spec"]["template"]["metadata"]["labels"]
            ),
            "{name}: the selector does not select its own pods"
        );
        assert_eq!(
            objects.selected(&w["spec"]["selector"]["matchLabels"]),
            vec![name],
            "{name}'s selector also selects other workloads' pods"
        );
    }
    let expect = [
        ("tutor-gateway", "tutor-gateway"),
        ("tutor-gateway-admin", "tutor-gateway"),
        ("redis", "redis"),
        ("vllm", "vllm"),
    ];
    for (service, workload) in expect {
        let s = objects.get("Service", service);
        assert_eq!(
            objects.selected(&s["spec"]["selector"]),
            vec![workload],
            "Service {service}"
        );
    }
    assert_eq!(objects.of_kind("Service").count(), expect.len());
    let pdb = objects.get("PodDisruptionBudget", "tutor-gateway");
    assert_eq!(
        objects.selected(&pdb["spec"]["selector"]["matchLabels"]),
        vec!["tutor-gateway"]
    );
    // Every gateway pod is unready together while vLLM is down (`/readyz`): a budget of ready
    // pods would refuse every eviction then, and a node drain would hang.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    let (_, pod, _) = objects.gateway();
    for spread in pod["topologySpreadConstraints"].as_array().unwrap() {
        assert_eq!(
            objects.selected(&spread["labelSelector"]["matchLabels"]),
            vec!["tutor-gateway"]
        );
    }
    // The StatefulSet's governing Service exists.
    let redis = objects.get("StatefulSet", "redis");
    objects.get("Service", redis["spec"]["serviceName"].as_str().unwrap());
}

/// Service target ports, probe ports and NetworkPolicy ports name ports the selected pods have.
#[test]
fn every_port_used_is_a_port_of_the_pods() {
    let objects = Objects::load();
    let pod_of = |workload: &str| -> Value {
        let w = objects
            .workloads()
            .into_iter()
            .find(|(n, _)| *n == workload)
            .unwrap()
            .1;
        w["spec"]["template"]["spec"].clone()
    };
    for s in objects.of_kind("Service") {
        let name = s["metadata"]["name"].as_str().unwrap();
        let workload = objects.selected(&s["spec"]["selector"])[0];
        for p in s["spec"]["ports"].as_array().unwrap() {
            assert!(
                container_port(&pod_of(workload), &p["targetPort"]).is_some(),
                "Service {name}: targetPort {} is not a port of {workload}",
                p["targetPort"]
            );
        }
    }
    for (name, w) in objects.workloads() {
        let pod = &w["spec"]["template"]["spec"];
        for c in pod["containers"].as_array().unwrap() {
            for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
                let p = &c[probe];
                let port = if p["httpGet"].is_object() {
                    &p["httpGet"]["port"]
                } else if p["tcpSocket"].is_object() {
                    &p["tcpSocket"]["port"]
                } else {
                    continue;
                };
                assert!(
                    container_port(pod, port).is_some(),
                    "{name}: the {probe}'s port {port} is not a container port"
                );
            }
        }
    }
    let mut policies = 0;
    for np in objects.of_kind("NetworkPolicy") {
        let name = np["metadata"]["name"].as_str().unwrap();
        let targets = objects.selected(&np["spec"]["podSelector"]["matchLabels"]);
        if np["spec"]["podSelector"]
            .as_object()
            .is_some_and(|m| m.is_empty())
        {
            continue; // the namespace-wide default deny
        }
        policies += 1;
        assert_eq!(targets.len(), 1, "NetworkPolicy {name} selects {targets:?}");
        let pod = pod_of(targets[0]);
        for rule in np["spec"]["ingress"].as_array().unwrap() {
            for p in rule["ports"].as_array().unwrap() {
                assert!(
                    container_port(&pod, &p["port"]).is_some(),
                    "NetworkPolicy {name}: ingress port {} is not a port of {}",
                    p["port"],
                    targets[0]
                );
            }
        }
        for rule in np["spec"]["egress"].as_array().cloned().unwrap_or_default() {
            for to in rule["to"].as_array().unwrap() {
                if to["podSelector"].is_null() {
                    continue;
                }
                let peers = objects.selected(&to["podSelector"]["matchLabels"]);
                assert_eq!(peers.len(), 1, "NetworkPolicy {name}: egress to {peers:?}");
                for p in rule["ports"].as_array().unwrap() {
                    assert!(
                        container_port(&pod_of(peers[0]), &p["port"]).is_some(),
                        "NetworkPolicy {name}: egress port {} is not a port of {}",
                        p["port"],
                        peers[0]
                    );
                }
            }
        }
    }
    assert_eq!(policies, 3, "a policy each for the gateway, Redis and vLLM");
}

/// Only the gateway reaches Redis and vLLM (Prometheus also reaches vLLM's `/metrics`); the
/// gateway's admin port admits only the monitoring namespace, its request port everyone.
#[test]
fn only_the_gateway_reaches_redis_and_vllm_and_only_monitoring_its_admin_port() {
    let objects = Objects::load();
    let monitoring = |peer: &Value| {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"
    };
    let gateway_pods = |peer: &Value| {
        peer["podSelector"].is_object()
            && objects.selected(&peer["podSelector"]["matchLabels"]) == vec!["tutor-gateway"]
    };
    let deny = objects
        .of_kind("NetworkPolicy")
        .find(|np| {
            np["spec"]["podSelector"]
                .as_object()
                .is_some_and(|m| m.is_empty())
        })
        .expect("a default deny");
    assert!(
        deny["spec"]["ingress"].is_null(),
        "the default admits nobody"
    );
    for (policy, extra) in [("redis", false), ("vllm", true)] {
        let np = objects.get("NetworkPolicy", policy);
        for rule in np["spec"]["ingress"].as_array().unwrap() {
            let from = rule["from"].as_array().expect("every rule names its peers");
            for peer in from {
                assert!(
                    gateway_pods(peer) || (extra && monitoring(peer)),
                    "{policy} admits {peer}"
                );
            }
        }
    }
    let np = objects.get("NetworkPolicy", "tutor-gateway");
    for rule in np["spec"]["ingress"].as_array().unwrap() {
        let ports: Vec<&Value> = rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| &p["port"])
            .collect();
        if ports.iter().any(|p| *p == "admin") {
            let from = rule["from"]
                .as_array()
                .expect("the admin port names its peers");
            assert!(from.iter().all(monitoring), "admin port admits {from:?}");
        } else {
            assert!(ports.iter().all(|p| *p == "http"), "{ports:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// the gateway's config against its pod

/// The ConfigMap's config passes `tutor-gateway check-config` (with the password variable the
/// pod sets from its Secret).
#[test]
fn the_config_map_holds_a_config_the_gateway_accepts() {
    let objects = Objects::load();
    let (text, table) = gateway_config(&objects);
    let tmp = std::env::temp_dir().join(format!("tg-k8s-config-{}.toml", std::process::id()));
    std::fs::write(&tmp, &text).unwrap();
    let var = toml_str(&table, "quota", "redis_password_env");
    let out = Command::new(env!("CARGO_BIN_EXE_tutor-gateway"))
        .arg("check-config")
        .arg(&tmp)
        .env(var, "a-password-for-the-check")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&tmp);
    assert!(
        out.status.success(),
        "check-config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The pod and its config agree: the listeners are the container's ports, the config file is
/// where `--config` reads it and is mounted whole (so ConfigMap updates reach it) and watched,
/// the password variable comes from a Secret, vLLM and Redis are the Services of the same
/// deployment, the replicas match the fallback divisor and the autoscaler's floor.
#[test]
fn the_config_agrees_with_the_pod_and_the_services() {
    let objects = Objects::load();
    let (table, (deployment, pod, c)) = (gateway_config(&objects).1, objects.gateway());
    let named = |name: &str| container_port(pod, &Value::from(name)).unwrap();
    assert_eq!(port_of(toml_str(&table, "", "listen")), named("http"));
    assert_eq!(
        port_of(toml_str(&table, "server", "admin_listen")),
        named("admin")
    );
    assert!(toml_str(&table, "", "listen").starts_with("0.0.0.0:"));
    // --config FILE: FILE is a key of the ConfigMap, under a whole-directory mount.
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let file = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| file.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .expect("the config file is on a mounted volume");
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount never sees ConfigMap updates"
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], "tutor-gateway-config");
    let key = file.rsplit('/').next().unwrap();
    assert!(objects.get("ConfigMap", "tutor-gateway-config")["data"][key].is_string());
    assert!(toml_u64(&table, "server", "config_watch_ms").unwrap_or(0) > 0);
    // The Redis password: an env var of the container, from a Secret.
    let var = toml_str(&table, "quota", "redis_password_env");
    let env = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == var)
        .unwrap_or_else(|| panic!("the container sets {var}"));
    assert!(env["valueFrom"]["secretKeyRef"].is_object());
    assert!(
        !toml_str(&table, "quota", "redis_url").contains('@'),
        "no password in the file"
    );
    // vLLM and Redis: Services of this deployment, on their ports.
    for (url, service) in [
        (toml_str(&table, "upstream", "base_url"), "vllm"),
        (toml_str(&table, "quota", "redis_url"), "redis"),
    ] {
        assert_eq!(host_of(url), service);
        let s = objects.get("Service", service);
        assert!(
            s["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["port"].as_u64() == Some(port_of(url))),
            "{url}: not a port of Service {service}"
        );
    }
    // The model vLLM serves is the one the gateway asks for.
    let vllm = &objects.get("Deployment", "vllm")["spec"]["template"]["spec"];
    let model = format!("--model={}", toml_str(&table, "upstream", "model"));
    assert!(container(vllm, "vllm")["args"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == &Value::from(model.as_str())));
    // Replicas: the fail-open divisor, the Deployment and the autoscaler's floor.
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
    assert!(replicas >= 2);
    assert_eq!(
        toml_u64(&table, "quota", "expected_replicas"),
        Some(replicas)
    );
    let hpa = objects.get("HorizontalPodAutoscaler", "tutor-gateway");
    assert_eq!(hpa["spec"]["minReplicas"].as_u64(), Some(replicas));
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        deployment["metadata"]["name"]
    );
    // The autoscaler adds replicas before one refuses work.
    let in_flight = toml_u64(&table, "server", "max_requests_in_flight").unwrap();
    for m in hpa["spec"]["metrics"].as_array().unwrap() {
        if m["type"] == "Pods" {
            let target: u64 = m["pods"]["target"]["averageValue"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                target < in_flight,
                "scales at {target}, refuses at {in_flight}"
            );
        }
    }
}

/// SIGTERM comes after the preStop pause; the gateway then announces the drain, lets streams
/// finish for `shutdown_grace_ms`, and exits, all before the kubelet's SIGKILL. A readiness
/// probe notices the drain before the listener closes.
#[test]
fn the_drain_fits_in_the_termination_grace_period() {
    let objects = Objects::load();
    let (table, (_, pod, c)) = (gateway_config(&objects).1, objects.gateway());
    let grace_ms = pod["terminationGracePeriodSeconds"].as_u64().unwrap() * 1000;
    let command = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .unwrap();
    assert_eq!(command[0], "sleep");
    let pre_stop_ms = command[1].as_str().unwrap().parse::<u64>().unwrap() * 1000;
    assert!(pre_stop_ms > 0);
    let announce = toml_u64(&table, "server", "drain_announce_ms").unwrap_or(0);
    let shutdown = toml_u64(&table, "server", "shutdown_grace_ms").unwrap_or(30_000);
    // After the grace: the streams' last events and the connections' end (END_WAIT each, on
    // the public and the admin listener), the engine aborts and jobs' last writes (twice
    // ABORT_TIMEOUT), the leases and settlements reaching Redis (RELEASE_WAIT), the request
    // log's last lines (LOG_FLUSH_WAIT), the spans' flush (SPAN_FLUSH_WAIT), the diagnostic
    // log's last lines (LOG_FLUSH_WAIT again), and 1 s for the exit.
    use tutor_gateway::telemetry::otel::{LOG_FLUSH_WAIT, SPAN_FLUSH_WAIT};
    let end_wait = tutor_gateway::server::END_WAIT.as_millis() as u64;
    let exit_ms = 4 * end_wait
        + 2 * tutor_gateway::upstream::ABORT_TIMEOUT.as_millis() as u64
        + tutor_gateway::server::RELEASE_WAIT.as_millis() as u64
        + 2 * LOG_FLUSH_WAIT.as_millis() as u64
        + SPAN_FLUSH_WAIT.as_millis() as u64
        + 1_000;
    assert!(
        grace_ms >= pre_stop_ms + announce + shutdown + exit_ms,
        "terminationGracePeriodSeconds {} s < preStop {pre_stop_ms} ms + drain_announce_ms \
         {announce} + shutdown_grace_ms {shutdown} + {exit_ms} ms",
        grace_ms / 1000
    );
    let ready = &c["readinessProbe"];
    let notice_ms = ready["periodSeconds"].as_u64().unwrap()
        * ready["failureThreshold"].as_u64().unwrap()
        * 1000;
    assert!(
        notice_ms <= announce,
        "a readiness probe notices the drain in {notice_ms} ms, after the listener closed \
         ({announce} ms)"
    );
}

/// The memory limit holds the worst the config allows: every permitted stream's client buffer
/// and HTTP/2 send buffer full (a client that does not read), the queued bodies, the bodies being received, a head
/// still arriving on every open connection, and the process itself; the request
/// holds what was measured for a busy replica.
#[test]
fn the_memory_limit_covers_what_the_config_allows() {
    let objects = Objects::load();
    let (table, (_, _, c)) = (gateway_config(&objects).1, objects.gateway());
    let in_flight = toml_u64(&table, "server", "max_requests_in_flight").unwrap_or(4096);
    let buffer = toml_u64(&table, "server", "client_buffer_bytes").unwrap_or(1 << 20)
        + tutor_gateway::server::H2_SEND_BUFFER_BYTES as u64;
    let queued = toml_u64(&table, "server", "max_queued_bytes").unwrap_or(256 << 20);
    let receiving = toml_u64(&table, "server", "max_receiving_bytes").unwrap_or(256 << 20);
    let heads = toml_u64(&table, "server", "max_connections").unwrap_or(10_000)
        * toml_u64(&table, "server", "max_head_bytes").unwrap_or(32 << 10);
    let process = 64 << 20;
    let limit = bytes(c["resources"]["limits"]["memory"].as_str().unwrap());
    assert!(
        limit >= in_flight * buffer + queued + receiving + heads + process,
        "limit {limit} < {in_flight} streams x {buffer} + {queued} queued + {receiving} \
         being received + {heads} of heads arriving + {process}"
    );
    let request = bytes(c["resources"]["requests"]["memory"].as_str().unwrap());
    // Measured (scripts/measure-stream-memory): 16 MiB idle, 46 MiB with 500 streams.
    assert!(request >= 64 << 20 && request <= limit);
}

/// vLLM's pod has its memory requested and bounded above what it requests plus its
/// memory-backed `/dev/shm` (a pod with none is evicted first under memory pressure, the shm
/// counted against nothing), and its probes give a busy API server more than the default
/// second (a liveness timeout restarts it, and the model takes minutes to load again).
#[test]
fn vllm_has_its_memory_and_patient_probes() {
    let objects = Objects::load();
    let d = objects.get("Deployment", "vllm");
    let pod = &d["spec"]["template"]["spec"];
    let c = container(pod, "vllm");
    let request = bytes(c["resources"]["requests"]["memory"].as_str().unwrap());
    let limit = bytes(c["resources"]["limits"]["memory"].as_str().unwrap());
    let shm = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["emptyDir"]["medium"] == "Memory")
        .map_or(0, |v| bytes(v["emptyDir"]["sizeLimit"].as_str().unwrap()));
    assert!(
        limit >= request + shm,
        "limit {limit} < {request} + shm {shm}"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        let timeout = c[probe]["timeoutSeconds"].as_u64().unwrap_or(1);
        assert!(timeout >= 5, "{probe} times out after {timeout} s");
    }
}

/// vLLM fetches media URLs itself, and follows their redirects unless told not to: the gateway
/// checks only the URL it is sent against `fields.media_hosts`, so a listed host that redirects
/// would lead vLLM anywhere (the cloud's metadata address, the cluster's services). Both shipped
/// ways to run vLLM turn redirects off.
#[test]
fn vllm_follows_no_media_redirect() {
    let objects = Objects::load();
    let pod = &objects.get("Deployment", "vllm")["spec"]["template"]["spec"];
    let set = container(pod, "vllm")["env"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "VLLM_MEDIA_URL_ALLOW_REDIRECTS" && e["value"] == "0");
    assert!(set, "deploy/kubernetes/vllm.yaml");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/docker-compose.yml");
    let compose = yaml_files(std::slice::from_ref(&path));
    let compose = &compose.values().next().unwrap()[0];
    assert_eq!(
        compose["services"]["vllm"]["environment"]["VLLM_MEDIA_URL_ALLOW_REDIRECTS"], "0",
        "deploy/docker-compose.yml"
    );
}

/// The pods run as the image's non-root user, with a read-only root filesystem, no privilege
/// escalation, no capabilities and no service-account token.
#[test]
fn the_pods_are_locked_down() {
    let objects = Objects::load();
    let dockerfile = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/Dockerfile"),
    )
    .unwrap();
    let uid: u64 = dockerfile
        .split("--uid ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("the Dockerfile names its user's uid");
    let (_, pod, _) = objects.gateway();
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(uid));
    for name in ["tutor-gateway", "redis"] {
        let w = objects
            .workloads()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap()
            .1;
        let pod = &w["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
        for c in pod["containers"].as_array().unwrap() {
            let sc = &c["securityContext"];
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
            assert_eq!(
                sc["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{name}"
            );
        }
    }
}

/// Every Secret a pod reads (name and key) is created by the set-up commands at the top of
/// kustomization.yaml.
#[test]
fn every_secret_read_is_in_the_set_up_commands() {
    let objects = Objects::load();
    let setup = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let mut created: BTreeSet<(String, String)> = BTreeSet::new();
    let mut current = None;
    for line in setup.lines().filter_map(|l| l.strip_prefix('#')) {
        if let Some(rest) = line.split("create secret generic ").nth(1) {
            current = rest.split_whitespace().next().map(str::to_owned);
        }
        for part in line.split("--from-literal=").skip(1) {
            let key = part.split('=').next().unwrap().to_owned();
            created.insert((current.clone().expect("a secret being created"), key));
        }
    }
    let mut read = BTreeSet::new();
    for (name, w) in objects.workloads() {
        for c in w["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            for e in c["env"].as_array().cloned().unwrap_or_default() {
                let r = &e["valueFrom"]["secretKeyRef"];
                if r.is_object() {
                    let pair = (
                        r["name"].as_str().unwrap().to_owned(),
                        r["key"].as_str().unwrap().to_owned(),
                    );
                    assert!(
                        created.contains(&pair),
                        "{name} reads {pair:?}, which the set-up never creates"
                    );
                    read.insert(pair);
                }
            }
        }
    }
    assert_eq!(read, created, "secrets created but never read");
}

// ---------------------------------------------------------------------------------------------
// monitoring

/// The ServiceMonitors select one Service each, scrape a port it has, and set `job` to a name
/// the alert rules use; the PrometheusRule's groups are `deploy/prometheus/alerts.yml`'s.
#[test]
fn the_monitoring_objects_match_the_services_and_the_alert_rules() {
    let objects = Objects::load();
    let alerts_file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml");
    let alerts = yaml_files(std::slice::from_ref(&alerts_file));
    let alerts = &alerts["alerts.yml"][0];
    let rules_text = std::fs::read_to_string(&alerts_file).unwrap();
    let mut monitors = 0;
    for sm in objects.of_kind("ServiceMonitor") {
        monitors += 1;
        let name = sm["metadata"]["name"].as_str().unwrap();
        assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
        let services: Vec<&Value> = objects
            .of_kind("Service")
            .filter(|s| {
                selects(
                    &sm["spec"]["selector"]["matchLabels"],
                    &s["metadata"]["labels"],
                )
            })
            .collect();
        assert_eq!(
            services.len(),
            1,
            "ServiceMonitor {name} selects {} Services",
            services.len()
        );
        let service = services[0];
        for e in sm["spec"]["endpoints"].as_array().unwrap() {
            assert!(
                service["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["name"] == e["port"]),
                "ServiceMonitor {name}: port {} is not a port of its Service",
                e["port"]
            );
            assert_eq!(e["path"], "/metrics");
        }
        let job_label = sm["spec"]["jobLabel"].as_str().unwrap();
        let job = service["metadata"]["labels"][job_label].as_str().unwrap();
        assert!(
            rules_text.contains(&format!("job=\"{job}\"")),
            "ServiceMonitor {name}: job {job} is not a job the alert rules watch"
        );
    }
    assert_eq!(monitors, 2, "the gateway and vLLM");
    // The gateway's ServiceMonitor scrapes the admin port, never the public one.
    let sm = objects.get("ServiceMonitor", "tutor-gateway");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "admin");
    let rule = objects.get("PrometheusRule", "tutor-gateway");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        rule["spec"]["groups"], alerts["groups"],
        "alerts.yml's groups, verbatim"
    );
}

/// The Prometheus adapter's rule serves the metric the autoscaler reads.
#[test]
fn the_adapter_serves_the_metric_the_autoscaler_reads() {
    let objects = Objects::load();
    let values = yaml_files(&[dir().join("prometheus-adapter/values.yaml")]);
    let rules = values["values.yaml"][0]["rules"]["custom"]
        .as_array()
        .unwrap()
        .clone();
    let hpa = objects.get("HorizontalPodAutoscaler", "tutor-gateway");
    for m in hpa["spec"]["metrics"].as_array().unwrap() {
        if m["type"] != "Pods" {
            continue;
        }
        let metric = m["pods"]["metric"]["name"].as_str().unwrap();
        assert!(
            rules.iter().any(|r| r["name"]["as"] == metric
                && r["seriesQuery"].as_str().unwrap().starts_with(metric)),
            "no adapter rule serves {metric}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// the probes against a running gateway

/// The ConfigMap's config, run for real (its listeners moved to free loopback ports, vLLM the
/// simulator, the quota in process): every probe path answers 200 on the listener its port
/// names, and the ServiceMonitor's path serves the autoscaler's metric.
#[tokio::test]
async fn the_probes_answer_on_the_ports_they_name() {
    let objects = Objects::load();
    let (_, mut table) = gateway_config(&objects);
    let sim = vllm_sim::start(&vllm_sim::SimArgs::for_test(&common::flags(
        "--speed 50 --profile tiny-test",
    )))
    .await
    .unwrap();
    table.remove("listen");
    let server = table["server"].as_table_mut().unwrap();
    server.insert("admin_listen".into(), "127.0.0.1:0".into());
    let upstream = table["upstream"].as_table_mut().unwrap();
    upstream.insert("base_url".into(), sim.url().into());
    table.insert(
        "quota".into(),
        toml::Value::Table(toml::toml! { backend = "local" }),
    );
    let mut telemetry = toml::Table::new();
    telemetry.insert("request_log".into(), "off".into());
    table.insert("telemetry".into(), toml::Value::Table(telemetry));
    let rest = toml::to_string(&table).unwrap();
    let gw = common::process::GatewayProcess::start("k8s-probes", &rest, &[]).await;
    let admin = gw.admin_url().await;
    let (_, pod, c) = objects.gateway();
    let base = |port: &Value| match container_port(pod, port).unwrap() {
        8080 => gw.url.clone(),
        9091 => admin.clone(),
        other => panic!("port {other} is neither listener"),
    };
    // Each probe's path and port, as the manifest says (a missing one panics here).
    for probe in ["readinessProbe", "livenessProbe"] {
        let get = &c[probe]["httpGet"];
        let url = format!("{}{}", base(&get["port"]), get["path"].as_str().unwrap());
        let mut status = 0;
        // /readyz asks vLLM (the simulator) once it is up: tries for up to 20 s.
        for _ in 0..400 {
            status = common::client()
                .get(&url)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            if status == 200 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(status, 200, "{probe}: GET {url}:\n{}", gw.log());
    }
    let sm = objects.get("ServiceMonitor", "tutor-gateway");
    let admin = &sm["spec"]["endpoints"][0];
    let url = format!(
        "{}{}",
        base(&Value::from("admin")),
        admin["path"].as_str().unwrap()
    );
    let metrics = common::get_text(&url).await;
    assert!(
        metrics.contains("\ntutor_gateway_requests_in_flight "),
        "{url}"
    );
    drop(gw);
    sim.shutdown().await;
}
