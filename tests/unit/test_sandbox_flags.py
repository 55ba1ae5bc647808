"""The sandbox's command lines, without starting anything: the feature gates and runtime
config every control-plane component gets, merged with a caller's, and the linker flags
that write the pinned Kubernetes release into its commands."""

from __future__ import annotations

from batchsched.sandbox import build, features


def test_the_apiserver_gets_the_gates_and_serves_the_workload_api() -> None:
    args = features.apiserver_args(["--v=1"])
    assert args == [
        "--feature-gates=" + ",".join(features.FEATURE_GATES),
        "--runtime-config=scheduling.k8s.io/v1beta1=true",
        "--v=1",
    ]
    assert "GenericWorkload=true" in features.FEATURE_GATES


def test_a_callers_gates_are_merged_into_one_flag_and_win() -> None:
    args = features.apiserver_args([
        "--audit-log-format=json",
        "--feature-gates=GenericWorkload=false,WatchListClient=false",
        "--runtime-config=api/all=true",
    ])
    gates = [a for a in args if a.startswith("--feature-gates=")]
    assert len(gates) == 1
    settings = dict(g.split("=") for g in gates[0].removeprefix("--feature-gates=").split(","))
    assert settings["GenericWorkload"] == "false"
    assert settings["WatchListClient"] == "false"
    assert settings["DRAWorkloadResourceClaims"] == "true"
    assert [a for a in args if a.startswith("--runtime-config=")] == [
        "--runtime-config=scheduling.k8s.io/v1beta1=true,api/all=true"
    ]
    assert "--audit-log-format=json" in args


def test_other_flags_are_left_as_they_are() -> None:
    assert features.merge_list_flags(["--v=1", "--feature-gates", "A=true"]) == ["--v=1", "--feature-gates", "A=true"]


def test_the_kubernetes_commands_are_linked_with_the_pinned_release() -> None:
    version = build.kube_version()
    major, minor = version.removeprefix("v").split(".")[:2]
    flags = build.kube_ldflags()
    assert flags.startswith(build.STRIP_LDFLAGS + " ")
    for pkg in build.KUBE_VERSION_PACKAGES:
        assert f"-X {pkg}.gitVersion={version} " in flags
        assert f"-X {pkg}.gitMajor={major} " in flags
        assert f"-X {pkg}.gitMinor={minor} " in flags
