// The Helm chart (k8s/difftrain) rendered by the real Helm (`helm template`) for the values
// files in tests/k8s/values: which objects it makes and what the pods run; then `helm lint
// --strict`, and every object checked with kubernetes-validate --strict against the API of
// Kubernetes 1.30 and of the oldest version Chart.yaml claims.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/k8s/chart.h"

namespace difftrain::k8s {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::ShellQuote;

using Args = std::vector<std::string>;

class ChartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string error = PrepareTools(); !error.empty()) FAIL() << error;
  }

  // Renders and requires success.
  Rendered Render(const Args& args, const std::filesystem::path& chart = kChartDir) {
    Rendered r = RenderChart(args, "dit", chart);
    EXPECT_EQ(r.exit_code, 0) << r.text;
    return r;
  }

  // Renders and requires the renderer to fail with `message` in its error.
  void ExpectRenderError(const Args& args, const std::string& message) {
    Rendered r = RenderChart(args);
    EXPECT_NE(r.exit_code, 0) << r.text;
    EXPECT_THAT(r.text, HasSubstr(message));
  }
};

std::map<std::string, std::string> EnvValues(const YAML::Node& container) {
  std::map<std::string, std::string> env;
  for (const YAML::Node& e : container["env"]) {
    env[e["name"].as<std::string>()] = e["value"] ? e["value"].as<std::string>() : "";
  }
  return env;
}

TEST_F(ChartTest, GpuJobMakesTheControllerAndIndexedWorkerJobsWithTheirServices) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  std::multiset<std::string> kinds;
  for (const YAML::Node& o : r.objects)
    kinds.insert(o["kind"].as<std::string>());
  // No Secret or PVC (both exist already); the second ConfigMap is the Grafana dashboard's.
  EXPECT_EQ(kinds, (std::multiset<std::string>{"Job", "Job", "Service", "Service", "ConfigMap",
                                               "ConfigMap", "ServiceMonitor", "PrometheusRule"}))
      << r.text;
  for (const char* kind : {"Job", "Service"}) {
    EXPECT_TRUE(r.Find(kind, "dit-difftrain-controller")) << kind;
  }
  EXPECT_TRUE(r.Find("Job", "dit-difftrain-worker"));
  EXPECT_TRUE(r.Find("Service", "dit-difftrain-workers"));
  EXPECT_TRUE(r.Find("ConfigMap", "dit-difftrain-job"));
  const YAML::Node dashboards = r.Find("ConfigMap", "dit-difftrain-dashboards");
  ASSERT_TRUE(dashboards) << r.text;
  EXPECT_TRUE(dashboards["data"]["difftrain.json"]) << r.text;
}

TEST_F(ChartTest, ControllerPodRunsTheControllerWithTheJobSpecKeysAndCheckpoints) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  const YAML::Node job = r.Find("Job", "dit-difftrain-controller");
  ASSERT_TRUE(job) << r.text;
  EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].as<std::string>(), "team-a");
  EXPECT_EQ(job["spec"]["completions"].as<int>(), 1);
  EXPECT_EQ(job["spec"]["activeDeadlineSeconds"].as<int>(), 604800);
  EXPECT_EQ(job["spec"]["ttlSecondsAfterFinished"].as<int>(), 86400);

  const YAML::Node pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["priorityClassName"].as<std::string>(), "training-high");
  EXPECT_EQ(pod["nodeSelector"]["nvidia.com/gpu.product"].as<std::string>(),
            "NVIDIA-H100-80GB-HBM3");
  EXPECT_EQ(pod["tolerations"][0]["key"].as<std::string>(), "nvidia.com/gpu");
  EXPECT_EQ(pod["imagePullSecrets"][0]["name"].as<std::string>(), "registry-credentials");
  EXPECT_FALSE(pod["hostNetwork"]) << "only the workers use the node's network";

  const YAML::Node c = Container(job, "difftrain");
  ASSERT_TRUE(c);
  EXPECT_EQ(c["image"].as<std::string>(), "registry.example.com/difftrain:0.1.0-cuda");
  EXPECT_EQ(Strings(c["command"]), Args{"difftrain"});
  EXPECT_EQ(Strings(c["args"]),
            (Args{"controller", "/etc/difftrain/job/dit.yaml", "--bind", "tcp://0.0.0.0:29400",
                  "--keys", "/etc/difftrain/keys", "--nodes", "4", "--devices-per-node", "8",
                  "--metrics-port", "9400"}));
  const auto env = EnvValues(c);
  EXPECT_EQ(env.at("NCCL_DEBUG"), "INFO");
  EXPECT_EQ(env.at("NCCL_IB_GID_INDEX"), "3");
  EXPECT_EQ(env.at("NCCL_IB_HCA"), "mlx5_0,mlx5_1");
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "8");
  EXPECT_EQ(Named(c["ports"], "control")["containerPort"].as<int>(), 29400);
  EXPECT_EQ(Named(c["ports"], "metrics")["containerPort"].as<int>(), 9400);
  EXPECT_EQ(c["resources"]["requests"]["memory"].as<std::string>(), "2Gi");
  EXPECT_FALSE(c["resources"]["limits"]["nvidia.com/gpu"]) << "the controller needs no GPU";

  const YAML::Node annotations = job["spec"]["template"]["metadata"]["annotations"];
  EXPECT_EQ(annotations["prometheus.io/scrape"].as<std::string>(), "true");
  EXPECT_EQ(annotations["prometheus.io/port"].as<std::string>(), "9400");
  EXPECT_EQ(annotations["prometheus.io/path"].as<std::string>(), "/metrics");

  // The job spec, the keys (through the init container) and the checkpoint claim.
  EXPECT_EQ(Named(c["volumeMounts"], "job")["mountPath"].as<std::string>(), "/etc/difftrain/job");
  EXPECT_EQ(Named(c["volumeMounts"], "keys")["mountPath"].as<std::string>(), "/etc/difftrain/keys");
  EXPECT_EQ(Named(c["volumeMounts"], "checkpoints")["mountPath"].as<std::string>(), "/checkpoints");
  const YAML::Node volumes = pod["volumes"];
  EXPECT_EQ(Named(volumes, "job")["configMap"]["name"].as<std::string>(), "dit-difftrain-job");
  EXPECT_EQ(Named(volumes, "job")["configMap"]["items"][0]["path"].as<std::string>(), "dit.yaml");
  EXPECT_EQ(Named(volumes, "keys-secret")["secret"]["secretName"].as<std::string>(), "dit-xl-keys");
  EXPECT_EQ(Named(volumes, "checkpoints")["persistentVolumeClaim"]["claimName"].as<std::string>(),
            "dit-checkpoints");
}

// samples.enabled: a Job of its own that runs `difftrain sample --watch` on the run's
// checkpoint directory (the one the chart gives the job spec) from the checkpoint claim.
TEST_F(ChartTest, SamplesJobWatchesTheRunsCheckpointsOnTheClaim) {
  EXPECT_FALSE(Render({"-f", "cpu.yaml"}).Find("Job", "dit-difftrain-samples"));  // off by default
  const Rendered r =
      Render({"-f", "cpu.yaml", "--set", "samples.enabled=true", "--set",
              "samples.args={--classes,1}", "--set", "samples.tensorboardDir=/checkpoints/tb"});
  const YAML::Node job = r.Find("Job", "dit-difftrain-samples");
  ASSERT_TRUE(job) << r.text;
  EXPECT_EQ(job["metadata"]["labels"]["app.kubernetes.io/component"].as<std::string>(), "samples");
  const YAML::Node c = Container(job, "difftrain");
  EXPECT_EQ(Strings(c["args"]),
            (Args{"sample", "--checkpoint", "/checkpoints/dit", "--watch", "--watch-timeout",
                  "3600", "--out", "/checkpoints/dit-samples/grid.png", "--tensorboard",
                  "/checkpoints/tb", "--classes", "1"}));
  EXPECT_FALSE(c["resources"]["limits"]["nvidia.com/gpu"]);
  EXPECT_EQ(Named(c["volumeMounts"], "checkpoints")["mountPath"].as<std::string>(), "/checkpoints");
  EXPECT_EQ(Named(job["spec"]["template"]["spec"]["volumes"],
                  "checkpoints")["persistentVolumeClaim"]["claimName"]
                .as<std::string>(),
            "dit-difftrain-checkpoints");
  // The job spec's own checkpoint.dir, where it names one; a job spec the chart does not build
  // (an existing ConfigMap, specYaml) it cannot read, and asks for it.
  const Rendered own = Render({"-f", "cpu.yaml", "--set", "samples.enabled=true", "--set",
                               "job.spec.checkpoint.dir=/checkpoints/runs/a"});
  EXPECT_EQ(Strings(Container(own.Find("Job", "dit-difftrain-samples"), "difftrain")["args"])[2],
            "/checkpoints/runs/a");
  ExpectRenderError({"-f", "existing-configmap.yaml", "--set", "samples.enabled=true", "--set",
                     "checkpoint.enabled=true"},
                    "samples.checkpointDir: required with job.specYaml or job.existingConfigMap");
  ExpectRenderError(
      {"-f", "cpu.yaml", "--set", "samples.enabled=true", "--set", "checkpoint.enabled=false"},
      "samples.enabled: the samples Job reads the checkpoints");
}

TEST_F(ChartTest, KeysAreCopiedOwnerOnlyIntoMemoryBecauseDifftrainRefusesReadableKeyFiles) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  for (const char* name : {"dit-difftrain-controller", "dit-difftrain-worker"}) {
    const YAML::Node job = r.Find("Job", name);
    const YAML::Node init = Container(job, "keys", /*init=*/true);
    ASSERT_TRUE(init) << name;
    EXPECT_EQ(Strings(init["command"]),
              (Args{"install", "--mode=0600", "--target-directory=/etc/difftrain/keys",
                    "/etc/difftrain/keys-secret/controller.key",
                    "/etc/difftrain/keys-secret/client.key"}));
    EXPECT_EQ(init["image"].as<std::string>(),
              Container(job, "difftrain")["image"].as<std::string>());
    const YAML::Node volumes = job["spec"]["template"]["spec"]["volumes"];
    EXPECT_EQ(Named(volumes, "keys")["emptyDir"]["medium"].as<std::string>(), "Memory");
    EXPECT_EQ(Named(volumes, "keys-secret")["secret"]["defaultMode"].as<int>(), 0400);
    EXPECT_TRUE(Named(Container(job, "difftrain")["volumeMounts"], "keys")["readOnly"].as<bool>());
  }
}

TEST_F(ChartTest, WorkersAreAnIndexedJobOnePodPerNodeWithStableNames) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  const YAML::Node job = r.Find("Job", "dit-difftrain-worker");
  ASSERT_TRUE(job) << r.text;
  EXPECT_EQ(job["spec"]["completionMode"].as<std::string>(), "Indexed");
  EXPECT_EQ(job["spec"]["completions"].as<int>(), 4);
  EXPECT_EQ(job["spec"]["parallelism"].as<int>(), 4);
  EXPECT_EQ(job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"].as<std::string>(), "team-a");

  const YAML::Node pod = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod["subdomain"].as<std::string>(), "dit-difftrain-workers");
  EXPECT_TRUE(pod["hostNetwork"].as<bool>());
  EXPECT_EQ(pod["dnsPolicy"].as<std::string>(), "ClusterFirstWithHostNet");
  const YAML::Node anti =
      pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
  EXPECT_EQ(anti["topologyKey"].as<std::string>(), "kubernetes.io/hostname");
  EXPECT_EQ(anti["labelSelector"]["matchLabels"]["app.kubernetes.io/component"].as<std::string>(),
            "worker");

  const YAML::Node c = Container(job, "difftrain");
  EXPECT_EQ(Strings(c["args"]),
            (Args{"worker", "--controller", "tcp://dit-difftrain-controller:29400", "--node",
                  "$(DIFFTRAIN_NODE)", "--keys", "/etc/difftrain/keys", "--metrics-port", "9400",
                  "--devices", "8"}));
  // The node index is the completion index, declared before the variable that uses it
  // (Kubernetes expands $(VAR) only from variables defined earlier in the list).
  EXPECT_EQ(c["env"][0]["name"].as<std::string>(), "JOB_COMPLETION_INDEX");
  EXPECT_EQ(c["env"][0]["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>(),
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(c["env"][1]["name"].as<std::string>(), "DIFFTRAIN_NODE");
  EXPECT_EQ(c["env"][1]["value"].as<std::string>(), "dit-difftrain-worker-$(JOB_COMPLETION_INDEX)");
  EXPECT_EQ(EnvValues(c).at("NCCL_SOCKET_IFNAME"), "eth0");

  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(), 8);
  EXPECT_EQ(c["resources"]["limits"]["rdma/ib"].as<int>(), 1);
  EXPECT_EQ(c["resources"]["requests"]["cpu"].as<std::string>(), "64");
  EXPECT_EQ(Strings(c["securityContext"]["capabilities"]["add"]), Args{"IPC_LOCK"});
  EXPECT_EQ(Named(c["ports"], "metrics")["containerPort"].as<int>(), 9400);
  EXPECT_EQ(
      job["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"].as<std::string>(),
      "9400");

  EXPECT_EQ(Named(c["volumeMounts"], "shm")["mountPath"].as<std::string>(), "/dev/shm");
  const YAML::Node shm = Named(pod["volumes"], "shm")["emptyDir"];
  EXPECT_EQ(shm["medium"].as<std::string>(), "Memory");
  EXPECT_EQ(shm["sizeLimit"].as<std::string>(), "64Gi");
  EXPECT_FALSE(Named(pod["volumes"], "job")) << "workers get the job from the controller";
}

TEST_F(ChartTest, KubernetesNeverRestartsWhatTheControllerRestarts) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  for (const char* name : {"dit-difftrain-controller", "dit-difftrain-worker"}) {
    const YAML::Node spec = r.Find("Job", name)["spec"];
    EXPECT_EQ(spec["template"]["spec"]["restartPolicy"].as<std::string>(), "Never") << name;
    EXPECT_EQ(spec["backoffLimit"].as<int>(), 0) << name;
    const YAML::Node rules = spec["podFailurePolicy"]["rules"];
    ASSERT_EQ(rules.size(), 3u) << name;
    EXPECT_EQ(rules[0]["action"].as<std::string>(), "Ignore");
    EXPECT_EQ(rules[0]["onPodConditions"][0]["type"].as<std::string>(), "DisruptionTarget");
    EXPECT_EQ(rules[1]["action"].as<std::string>(), "Ignore");
    EXPECT_EQ(rules[1]["onExitCodes"]["values"].as<std::vector<int>>(), std::vector<int>{75});
    EXPECT_EQ(rules[2]["action"].as<std::string>(), "FailJob");
    EXPECT_EQ(rules[2]["onExitCodes"]["values"].as<std::vector<int>>(), (std::vector<int>{1, 2}));
    EXPECT_EQ(rules[2]["onExitCodes"]["containerName"].as<std::string>(), "difftrain");
    EXPECT_EQ(spec["template"]["spec"]["terminationGracePeriodSeconds"].as<int>(), 300);
  }
}

TEST_F(ChartTest, ServicesSelectThePodsAndTheServiceMonitorScrapesBoth) {
  const Rendered r = Render({"-f", "gpu.yaml"});
  const YAML::Node controller = r.Find("Service", "dit-difftrain-controller");
  const YAML::Node workers = r.Find("Service", "dit-difftrain-workers");
  ASSERT_TRUE(controller && workers) << r.text;
  EXPECT_EQ(workers["spec"]["clusterIP"].as<std::string>(), "None");
  EXPECT_TRUE(workers["spec"]["publishNotReadyAddresses"].as<bool>());
  EXPECT_EQ(Named(controller["spec"]["ports"], "control")["port"].as<int>(), 29400);

  // Each Service's selector matches its Job's pod labels.
  for (const auto& [service, job] :
       {std::pair{controller, r.Find("Job", "dit-difftrain-controller")},
        std::pair{workers, r.Find("Job", "dit-difftrain-worker")}}) {
    const YAML::Node labels = job["spec"]["template"]["metadata"]["labels"];
    for (const auto& kv : service["spec"]["selector"]) {
      EXPECT_EQ(labels[kv.first.as<std::string>()].as<std::string>(), kv.second.as<std::string>());
    }
    EXPECT_TRUE(Named(service["spec"]["ports"], "metrics")) << service["metadata"]["name"];
  }

  const YAML::Node monitor = r.Find("ServiceMonitor", "dit-difftrain");
  ASSERT_TRUE(monitor);
  EXPECT_EQ(monitor["metadata"]["labels"]["release"].as<std::string>(), "kube-prometheus-stack");
  EXPECT_EQ(monitor["spec"]["endpoints"][0]["port"].as<std::string>(), "metrics");
  EXPECT_TRUE(monitor["spec"]["endpoints"][0]["honorLabels"].as<bool>());
  for (const YAML::Node& service : {controller, workers}) {
    for (const auto& kv : monitor["spec"]["selector"]["matchLabels"]) {
      EXPECT_EQ(service["metadata"]["labels"][kv.first.as<std::string>()].as<std::string>(),
                kv.second.as<std::string>());
    }
  }
}

TEST_F(ChartTest, InlineJobSpecIsTheConfigMapWithCheckpointDirOnTheVolume) {
  const Rendered gpu = Render({"-f", "gpu.yaml"});
  const YAML::Node spec =
      YAML::Load(gpu.Find("ConfigMap", "dit-difftrain-job")["data"]["job.yaml"].as<std::string>());
  EXPECT_EQ(spec["model"]["name"].as<std::string>(), "DiT-XL/2");
  EXPECT_EQ(spec["batch"]["global"].as<int>(), 1024);  // an integer, not 1024.0
  EXPECT_EQ(spec["optimizer"]["lr"].as<double>(), 0.0001);
  EXPECT_EQ(spec["checkpoint"]["dir"].as<std::string>(), "/checkpoints/dit-xl");  // as given

  // No checkpoint.dir in the spec: the chart puts it on the checkpoint volume.
  const Rendered cpu = Render({"-f", "cpu.yaml"});
  const YAML::Node cpu_spec =
      YAML::Load(cpu.Find("ConfigMap", "dit-difftrain-job")["data"]["job.yaml"].as<std::string>());
  EXPECT_EQ(cpu_spec["checkpoint"]["dir"].as<std::string>(), "/checkpoints/dit");

  // A spec given as text is used verbatim.
  const std::filesystem::path text = std::filesystem::temp_directory_path() /
                                     ("chart_test_job_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(text) << "# my job\ntrain: {steps: 7}\n";
  const Rendered verbatim =
      Render({"-f", "cpu.yaml", "--set-file", "job.specYaml=" + text.string()});
  std::filesystem::remove(text);
  EXPECT_EQ(verbatim.Find("ConfigMap", "dit-difftrain-job")["data"]["job.yaml"].as<std::string>(),
            "# my job\ntrain: {steps: 7}\n");
}

TEST_F(ChartTest, CpuJobRequestsNoGpuAndMakesTheKeysSecretAndCheckpointClaim) {
  const Rendered r = Render({"-f", "cpu.yaml"});
  const YAML::Node worker = r.Find("Job", "dit-difftrain-worker");
  const YAML::Node c = Container(worker, "difftrain");
  EXPECT_FALSE(c["resources"]["limits"]["nvidia.com/gpu"]);
  EXPECT_EQ(c["resources"]["limits"]["cpu"].as<std::string>(), "2");
  EXPECT_EQ(Strings(c["args"]).back(), "2") << "--devices: cpuRanksPerNode";
  EXPECT_FALSE(worker["spec"]["template"]["spec"]["affinity"]) << "onePodPerNode: false";
  EXPECT_FALSE(worker["spec"]["template"]["spec"]["hostNetwork"]);
  EXPECT_FALSE(c["securityContext"]) << "no RDMA, no IPC_LOCK";
  const Args controller_args =
      Strings(Container(r.Find("Job", "dit-difftrain-controller"), "difftrain")["args"]);
  EXPECT_EQ(controller_args[7], "2");  // --nodes
  EXPECT_EQ(controller_args[9], "2");  // --devices-per-node

  const YAML::Node secret = r.Find("Secret", "dit-difftrain-keys");
  ASSERT_TRUE(secret) << r.text;
  // base64 of the files given in keys.files.
  EXPECT_EQ(secret["data"]["client.key"].as<std::string>(), "Y2xpZW50IHNlY3JldCBrZXkgbWF0ZXJpYWw=");
  EXPECT_TRUE(secret["data"]["controller.key"]);

  const YAML::Node pvc = r.Find("PersistentVolumeClaim", "dit-difftrain-checkpoints");
  ASSERT_TRUE(pvc) << r.text;
  EXPECT_EQ(pvc["metadata"]["annotations"]["helm.sh/resource-policy"].as<std::string>(), "keep");
  EXPECT_EQ(pvc["spec"]["resources"]["requests"]["storage"].as<std::string>(), "10Gi");
  EXPECT_EQ(pvc["spec"]["storageClassName"].as<std::string>(), "nfs");
  EXPECT_EQ(Strings(pvc["spec"]["accessModes"]), Args{"ReadWriteMany"});
  EXPECT_EQ(Named(worker["spec"]["template"]["spec"]["volumes"],
                  "checkpoints")["persistentVolumeClaim"]["claimName"]
                .as<std::string>(),
            "dit-difftrain-checkpoints");
}

TEST_F(ChartTest, ExistingConfigMapIsMountedAndNothingOptionalIsMade) {
  const Rendered r = Render({"-f", "existing-configmap.yaml"});
  EXPECT_EQ(r.Count("ConfigMap"), 0) << r.text;
  EXPECT_EQ(r.Count("Secret"), 0);
  EXPECT_EQ(r.Count("PersistentVolumeClaim"), 0);
  EXPECT_EQ(r.Count("ServiceMonitor"), 0);
  EXPECT_EQ(r.Count("PrometheusRule"), 0);
  const YAML::Node job = r.Find("Job", "dit-difftrain-controller");
  const YAML::Node volumes = job["spec"]["template"]["spec"]["volumes"];
  EXPECT_EQ(Named(volumes, "job")["configMap"]["name"].as<std::string>(), "my-job");
  EXPECT_EQ(Named(volumes, "job")["configMap"]["items"][0]["key"].as<std::string>(), "dit.yaml");
  EXPECT_FALSE(Named(volumes, "checkpoints"));
  EXPECT_FALSE(job["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"]);
  // The defaults of values.yaml.
  const YAML::Node c = Container(job, "difftrain");
  EXPECT_EQ(c["image"].as<std::string>(), "difftrain:0.1.0");
  EXPECT_EQ(Strings(c["args"])[7], "2");
  EXPECT_EQ(Strings(c["args"])[9], "8");
  EXPECT_EQ(Container(r.Find("Job", "dit-difftrain-worker"),
                      "difftrain")["resources"]["limits"]["nvidia.com/gpu"]
                .as<int>(),
            8);
}

// Values merge as in Helm: maps deeply, and a user's null removes a default.
TEST_F(ChartTest, UserValuesMergeWithTheDefaultsAsInHelm) {
  const Rendered r = Render({"-f", "cpu.yaml", "--set", "nccl.env.NCCL_DEBUG=null", "--set",
                             "nccl.env.NCCL_P2P_DISABLE=1", "--set", "controller.port=30000"});
  const YAML::Node c = Container(r.Find("Job", "dit-difftrain-worker"), "difftrain");
  const auto env = EnvValues(c);
  EXPECT_FALSE(env.count("NCCL_DEBUG")) << r.text;
  EXPECT_EQ(env.at("NCCL_P2P_DISABLE"), "1");
  EXPECT_EQ(Strings(c["args"])[2], "tcp://dit-difftrain-controller:30000");
  // The rest of `controller` keeps its defaults.
  EXPECT_EQ(Container(r.Find("Job", "dit-difftrain-controller"),
                      "difftrain")["resources"]["requests"]["memory"]
                .as<std::string>(),
            "2Gi");
}

TEST_F(ChartTest, MissingOrInconsistentValuesFailNamingTheValue) {
  ExpectRenderError({"--set", "keys.existingSecret=k"}, "job: set job.spec");
  ExpectRenderError({"-f", "existing-configmap.yaml", "--set", "keys.existingSecret="},
                    "keys: the job's CURVE keys are required");
  ExpectRenderError({"-f", "cpu.yaml", "--set", "job.spec.checkpoint.dir=/tmp/ckpt"},
                    "job.spec.checkpoint.dir \"/tmp/ckpt\" is not on the checkpoint volume");
  ExpectRenderError({"-f", "cpu.yaml", "--set", "job.spec.checkpoint.dir=/checkpoints-old/x"},
                    "is not on the checkpoint volume");
  ExpectRenderError({"-f", "cpu.yaml", "--set", "image.repository="},
                    "image.repository is required");
}

TEST_F(ChartTest, GrafanaDashboardConfigMapHoldsTheChartsDashboardFiles) {
  // A copy of the chart with one more dashboard.
  const std::filesystem::path chart = std::filesystem::temp_directory_path() /
                                      ("chart_test_dashboards_" + std::to_string(::getpid()));
  std::filesystem::remove_all(chart);
  std::filesystem::copy(kChartDir, chart, std::filesystem::copy_options::recursive);
  std::filesystem::create_directories(chart / "dashboards");
  std::ofstream(chart / "dashboards/training.json") << "{\"title\": \"difftrain\"}\n";
  const Rendered r = Render({"-f", "gpu.yaml"}, chart);
  const Rendered off =
      Render({"-f", "gpu.yaml", "--set", "grafana.dashboards.enabled=false"}, chart);
  std::filesystem::remove_all(chart);

  const YAML::Node map = r.Find("ConfigMap", "dit-difftrain-dashboards");
  ASSERT_TRUE(map) << r.text;
  EXPECT_EQ(map["metadata"]["labels"]["grafana_dashboard"].as<std::string>(), "1");
  EXPECT_EQ(map["metadata"]["annotations"]["grafana_folder"].as<std::string>(), "difftrain");
  EXPECT_EQ(map["data"]["training.json"].as<std::string>(), "{\"title\": \"difftrain\"}\n");
  EXPECT_FALSE(off.Find("ConfigMap", "dit-difftrain-dashboards"));
}

// The oldest Kubernetes the chart claims (Chart.yaml's kubeVersion, ">=X.Y.Z-0"), as X.Y.Z.
std::string OldestKubernetes() {
  const std::string claim =
      YAML::LoadFile((kChartDir / "Chart.yaml").string())["kubeVersion"].as<std::string>();
  std::smatch m;
  if (!std::regex_match(claim, m, std::regex(R"(>=\s*v?(\d+\.\d+\.\d+)(-0)?)"))) return "";
  return m[1];
}

// kubernetes-validate --strict on `manifests` for Kubernetes `version`.
testing::CommandResult ValidateSchema(const std::string& manifests, const std::string& version) {
  const std::filesystem::path file =
      ToolsDir() / ("manifests-" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << manifests;
  testing::CommandResult result =
      RunCommand(ShellQuote((ToolsDir() / "venv/bin/kubernetes-validate").string()) + " -k " +
                 ShellQuote(version) + " --strict " + ShellQuote(file.string()));
  std::filesystem::remove(file);
  return result;
}

// Custom resources of operators, which have no schema in Kubernetes' own API.
const std::set<std::string> kCustomKinds = {"ServiceMonitor", "PrometheusRule"};

class ValuesFileTest : public ChartTest, public ::testing::WithParamInterface<std::string> {};

// `helm lint --strict`: warnings (an unused value, a deprecated API) are errors too.
TEST_P(ValuesFileTest, HelmLintStrictPasses) {
  const testing::CommandResult lint =
      RunCommand(HelmCommand() + " lint --strict " + ShellQuote(kChartDir.string()) +
                 HelmArgs({"-f", GetParam()}));
  EXPECT_EQ(lint.exit_code, 0) << lint.output;
  EXPECT_THAT(lint.output, HasSubstr("1 chart(s) linted, 0 chart(s) failed"));
}

// Every object of every values file passes strict validation (unknown fields rejected)
// against the API of Kubernetes 1.30 and of the oldest version the chart claims.
TEST_P(ValuesFileTest, EveryObjectMatchesTheKubernetesApiSchema) {
  const std::string oldest = OldestKubernetes();
  ASSERT_FALSE(oldest.empty()) << "Chart.yaml's kubeVersion is not \">=X.Y.Z-0\"";
  for (const std::string& version : {std::string("1.30.0"), oldest}) {
    const Rendered r = Render({"-f", GetParam(), "--kube-version", version});
    ASSERT_EQ(r.exit_code, 0);
    const testing::CommandResult result = ValidateSchema(r.text, version);
    EXPECT_EQ(result.exit_code, 0) << "Kubernetes " << version << ":\n" << result.output;
    // Each object is named as passed; only the operators' custom resources are not checked.
    int checked = 0;
    for (const YAML::Node& o : r.objects) {
      const std::string kind = o["kind"].as<std::string>();
      if (kCustomKinds.count(kind)) continue;
      std::string lower = kind;
      for (char& c : lower)
        c = static_cast<char>(std::tolower(c));
      EXPECT_THAT(
          result.output,
          HasSubstr("passed for resource " + lower + "/" + o["metadata"]["name"].as<std::string>() +
                    " against version " + version.substr(0, version.rfind('.'))))
          << kind << " for Kubernetes " << version << ":\n"
          << result.output;
      ++checked;
    }
    EXPECT_GE(checked, 4) << version;
  }
}

INSTANTIATE_TEST_SUITE_P(ValuesFiles, ValuesFileTest,
                         ::testing::Values("gpu.yaml", "cpu.yaml", "existing-configmap.yaml",
                                           "simulation.yaml"),
                         [](const auto& info) {
                           std::string name = info.param.substr(0, info.param.find('.'));
                           std::erase(name, '-');
                           return name;
                         });

// Every values file the tests use is one of those above (a new file is linted and
// validated once it is added to the list).
TEST_F(ChartTest, EveryValuesFileIsLintedAndValidated) {
  std::set<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(kValuesDir))
    files.insert(e.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"cpu.yaml", "existing-configmap.yaml", "gpu.yaml",
                                          "simulation.yaml"}));
}

// The schema check is not vacuous: it rejects what the API server would.
TEST_F(ChartTest, SchemaCheckRejectsUnknownFieldsWrongTypesAndMissingFields) {
  const testing::CommandResult result = ValidateSchema(R"(apiVersion: batch/v1
kind: Job
metadata: {name: bad, labels: {index: 3}}
spec:
  backofLimit: 2
  template:
    spec:
      containers: [{image: x}]
      volumes: [{name: keys, secret: {defaultMode: "0400"}}]
)",
                                                       "1.30.0");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("did not validate for resource job/bad"));
}

// The oldest Kubernetes the chart claims is checked for what changed since: 1.26 requires
// onPodConditions in every podFailurePolicy rule (the chart gives an empty list).
TEST_F(ChartTest, PodFailurePolicyWithoutOnPodConditionsFailsTheOldestKubernetes) {
  const std::string job = R"(apiVersion: batch/v1
kind: Job
metadata: {name: old}
spec:
  podFailurePolicy:
    rules: [{action: Ignore, onExitCodes: {operator: In, values: [75]}}]
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: x}]
)";
  EXPECT_EQ(ValidateSchema(job, "1.30.0").exit_code, 0);
  const testing::CommandResult old = ValidateSchema(job, OldestKubernetes());
  EXPECT_NE(old.exit_code, 0) << old.output;
  EXPECT_THAT(old.output, HasSubstr("'onPodConditions' is a required property"));
}

}  // namespace
}  // namespace difftrain::k8s
