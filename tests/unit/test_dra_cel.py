"""CEL device selectors on devices shaped like NVIDIA's DRA driver publishes them."""

from __future__ import annotations

import pytest

from batchsched.core.dra.cel import (
    MAX_EXPRESSION_LENGTH,
    CelError,
    DeviceEnv,
    compile_selector,
    device_env,
)

NV = "gpu.nvidia.com"


def whole_gpu(product: str = "NVIDIA A100-SXM4-40GB", memory: str = "40Gi",
              driver_version: str = "550.54.15") -> DeviceEnv:
    return device_env(
        NV,
        {
            f"{NV}/type": {"string": "gpu"},
            f"{NV}/productName": {"string": product},
            f"{NV}/uuid": {"string": "GPU-4f9e5a1c"},
            f"{NV}/index": {"int": 0},
            f"{NV}/driverVersion": {"version": driver_version},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        {f"{NV}/memory": {"value": memory}},
    )


def mig_device(profile: str = "1g.10gb") -> DeviceEnv:
    return device_env(
        NV,
        {
            f"{NV}/type": {"string": "mig"},
            f"{NV}/profile": {"string": profile},
            f"{NV}/parentUUID": {"string": "GPU-4f9e5a1c"},
            f"{NV}/productName": {"string": "NVIDIA A100-SXM4-80GB"},
            f"{NV}/driverVersion": {"version": "550.54.15"},
        },
        {f"{NV}/memory": {"value": "9856Mi"}, f"{NV}/multiprocessors": {"value": "14"}},
        allow_multiple_allocations=True,
    )


def selects(expression: str, env: DeviceEnv) -> bool:
    return compile_selector(expression).matches(env)


def test_driver_class_selects_whole_gpus_not_mig_devices() -> None:
    gpu_class = f'device.driver == "{NV}" && device.attributes["{NV}"].type == "gpu"'
    mig_class = f'device.driver == "{NV}" && device.attributes["{NV}"].type == "mig"'
    assert selects(gpu_class, whole_gpu())
    assert not selects(gpu_class, mig_device())
    assert selects(mig_class, mig_device())
    assert not selects(gpu_class, device_env("other.example.com", {f"{NV}/type": {"string": "gpu"}}, {}))


def test_product_name() -> None:
    expr = f'device.attributes["{NV}"].productName == "NVIDIA A100-SXM4-40GB"'
    assert selects(expr, whole_gpu())
    assert not selects(expr, whole_gpu(product="NVIDIA A100-SXM4-80GB"))


@pytest.mark.parametrize(
    ("memory", "at_least_40", "above_40", "below_80"),
    [("40Gi", True, False, True), ("80Gi", True, True, False), ("39Gi", False, False, True)],
)
def test_memory_against_a_quantity(memory: str, at_least_40: bool, above_40: bool, below_80: bool) -> None:
    gpu = whole_gpu(memory=memory)
    mem = f'device.capacity["{NV}"].memory'
    assert selects(f'{mem}.compareTo(quantity("40Gi")) >= 0', gpu) is at_least_40
    assert selects(f'{mem}.isGreaterThan(quantity("40Gi"))', gpu) is above_40
    assert selects(f'{mem}.isLessThan(quantity("80Gi"))', gpu) is below_80
    # the same amount spelt in other units is equal, both ways round
    assert selects(f'quantity("40Gi").compareTo({mem}) <= 0', gpu) is at_least_40


def test_quantity_functions() -> None:
    gpu = whole_gpu(memory="40Gi")
    mem = f'device.capacity["{NV}"].memory'
    assert selects(f"{mem} == quantity(\"42949672960\")", gpu)
    assert selects(f"{mem}.asInteger() == 42949672960", gpu)
    assert selects(f"{mem}.asApproximateFloat() == 42949672960.0", gpu)
    assert selects(f'{mem}.add(quantity("40Gi")) == quantity("80Gi")', gpu)
    assert selects(f'{mem}.sub(1073741824) == quantity("39Gi")', gpu)
    assert selects(f"{mem}.isInteger() && sign({mem}) == 1", gpu)
    assert selects('!quantity("1.5").isInteger() && sign(quantity("-1")) == -1', gpu)
    assert selects('quantity("200M") == quantity("0.2G") && quantity("50M") != quantity("50Mi")', gpu)
    assert selects('isQuantity("1.3Gi") && !isQuantity("200K")', gpu)


@pytest.mark.parametrize(
    ("version", "at_least", "above", "below"),
    [("550.0.0", True, False, True), ("550.54.15", True, True, True),
     ("535.161.8", False, False, True), ("560.0.0", True, True, False),
     ("550.0.0-rc.1", False, False, True)],
)
def test_driver_version_against_a_semver(version: str, at_least: bool, above: bool, below: bool) -> None:
    gpu = whole_gpu(driver_version=version)
    ver = f'device.attributes["{NV}"].driverVersion'
    assert selects(f'{ver}.compareTo(semver("550.0.0")) >= 0', gpu) is at_least
    assert selects(f'{ver}.isGreaterThan(semver("550.0.0"))', gpu) is above
    assert selects(f'{ver}.isLessThan(semver("560.0.0"))', gpu) is below
    assert selects(f'semver("550.0.0").compareTo({ver}) <= 0', gpu) is at_least


def test_semver_functions() -> None:
    gpu = whole_gpu(driver_version="550.54.15+build.7")
    ver = f'device.attributes["{NV}"].driverVersion'
    assert selects(f"{ver}.major() == 550 && {ver}.minor() == 54 && {ver}.patch() == 15", gpu)
    # build metadata plays no part in comparing versions
    assert selects(f'{ver} == semver("550.54.15")', gpu)
    assert selects('semver("v550.02", true) == semver("550.2.0")', gpu)
    assert selects('isSemver("1.2.3-alpha.1") && !isSemver("1.2") && isSemver("1.2", true)', gpu)
    assert selects('semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1")) && '
                   'semver("1.0.0-alpha.2").isLessThan(semver("1.0.0-alpha.beta")) && '
                   'semver("1.0.0-rc.1").isLessThan(semver("1.0.0")) && '
                   'semver("1.0.0-rc.2").isLessThan(semver("1.0.0-rc.10"))', gpu)


def test_guards_on_attributes_a_device_may_lack() -> None:
    profile = f'device.attributes["{NV}"].profile'
    one_g = f'has({profile}) && {profile}.startsWith("1g")'
    assert selects(one_g, mig_device("1g.10gb"))
    assert not selects(one_g, mig_device("3g.40gb"))
    assert not selects(one_g, whole_gpu())
    assert selects(f'"{NV}" in device.attributes', whole_gpu())
    assert not selects('"example.com" in device.attributes', whole_gpu())
    # a domain the device has nothing in reads as an empty map, as upstream
    assert not selects('has(device.attributes["example.com"].model)', whole_gpu())
    assert selects('has(device.attributes["resource.kubernetes.io"].pcieRoot)', whole_gpu())
    assert not selects('has(device.attributes["resource.kubernetes.io"].pcieRoot)', mig_device())
    assert not selects('has(device.capacity["example.com"].memory)', whole_gpu())


def test_allow_multiple_allocations() -> None:
    assert selects("device.allowMultipleAllocations", mig_device())
    assert not selects("device.allowMultipleAllocations", whole_gpu())


def test_int_bool_and_list_attributes() -> None:
    env = device_env(
        "dra.example.com",
        {"dra.example.com/index": {"int": 3}, "dra.example.com/healthy": {"bool": True},
         "dra.example.com/links": {"strings": ["nvlink0", "nvlink1"]}},
        {},
    )
    assert selects('device.attributes["dra.example.com"].index > 2', env)
    assert selects('device.attributes["dra.example.com"].healthy', env)
    assert selects('"nvlink1" in device.attributes["dra.example.com"].links', env)


def test_string_extensions_of_the_kubernetes_environment() -> None:
    gpu = whole_gpu(product="NVIDIA H100 80GB HBM3")
    product = f'device.attributes["{NV}"].productName'
    assert selects(f'{product}.lowerAscii().contains("h100")', gpu)
    assert selects(f'{product}.upperAscii().startsWith("NVIDIA H100")', gpu)
    assert selects(f'{product}.split(" ")[1] == "H100" && {product}.split(" ", 2)[1] == "H100 80GB HBM3"', gpu)
    assert selects(f'{product}.substring(7, 11) == "H100" && {product}.charAt(7) == "H"', gpu)
    assert selects(f'{product}.indexOf("80GB") == 12 && {product}.lastIndexOf("H") == 17', gpu)
    assert selects(f'{product}.lastIndexOf("H", 16) == 7 && {product}.indexOf("H", 8) == 17', gpu)
    assert selects(f'{product}.replace(" ", "-", 1) == "NVIDIA-H100 80GB HBM3"', gpu)
    assert selects('"  1g.10gb ".trim() == "1g.10gb" && ["1g", "10gb"].join(".") == "1g.10gb"', gpu)
    assert selects('"abc".split("", 2) == ["a", "bc"] && "abc".indexOf("", 9) == 3', gpu)
    assert selects('["gpu", "mig"].indexOf("mig") == 1', gpu)
    with pytest.raises(CelError, match=r"substring\(\): index out of range: 40"):
        selects(f'{product}.substring(0, 40) == ""', gpu)


def test_a_missing_attribute_is_an_error_naming_the_expression() -> None:
    expr = f'device.attributes["{NV}"].profile == "1g.10gb"'
    with pytest.raises(CelError, match=r"profile.*no such key: profile"):
        selects(expr, whole_gpu())
    expr = 'device.attributes["example.com"].model == "x"'
    with pytest.raises(CelError, match=r"example\.com.*no such key: model"):
        selects(expr, whole_gpu())


def test_a_failing_function_is_an_error_naming_the_expression() -> None:
    with pytest.raises(CelError, match=r'quantity\("40GB"\).*bad quantity'):
        selects('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40GB")) >= 0', whole_gpu())
    with pytest.raises(CelError, match=r"compareTo\(\): no such overload.*needs a semver.*quantity"):
        selects(f'device.attributes["{NV}"].driverVersion.compareTo(quantity("1")) == 0', whole_gpu())


def test_a_compile_error_names_the_expression() -> None:
    with pytest.raises(CelError, match=r"'device\.driver == ' does not compile"):
        compile_selector("device.driver == ")


def test_functions_outside_the_environment_are_refused_when_compiled() -> None:
    with pytest.raises(CelError, match=r"format\(\[.*calls format, which"):
        compile_selector(f'"%s".format([device.attributes["{NV}"].productName]) == "A100"')
    with pytest.raises(CelError, match=r"calls family, ip, isIP, which"):
        compile_selector('isIP("10.0.0.1") && ip("10.0.0.1").family() == 4')


def test_cel_bind_names_a_domain_once() -> None:
    one_g = f'cel.bind(nv, device.attributes["{NV}"], has(nv.profile) && nv.profile.startsWith("1g"))'
    assert selects(one_g, mig_device("1g.10gb"))
    assert not selects(one_g, mig_device("3g.40gb"))
    assert not selects(one_g, whole_gpu())
    nested = (
        f'cel.bind(nv, device.attributes["{NV}"], cel.bind(mem, device.capacity["{NV}"].memory, '
        'nv.type == "gpu" && mem.compareTo(quantity("40Gi")) >= 0))'
    )
    assert selects(nested, whole_gpu(memory="80Gi"))
    assert not selects(nested, whole_gpu(memory="20Gi"))
    # the bound domain may be absent, and reads as an empty map, as upstream
    assert not selects('cel.bind(x, device.attributes["example.com"], has(x.model))', whole_gpu())


def test_a_result_that_is_not_a_bool_is_refused() -> None:
    with pytest.raises(CelError, match=r"'device\.driver' must evaluate to bool, got str"):
        selects("device.driver", whole_gpu())
    with pytest.raises(CelError, match="must evaluate to bool, got int"):
        selects(f'device.attributes["{NV}"].index', whole_gpu())


def test_a_bad_attribute_fails_each_evaluation_on_that_device() -> None:
    env = device_env(NV, {f"{NV}/driverVersion": {"version": "550.54"}}, {})
    with pytest.raises(CelError, match=r"attribute gpu\.nvidia\.com/driverVersion: bad semantic version"):
        selects(f'device.driver == "{NV}"', env)
    env = device_env(NV, {}, {f"{NV}/memory": {"value": "lots"}})
    with pytest.raises(CelError, match=r"capacity gpu\.nvidia\.com/memory: bad quantity"):
        selects("true", env)
    env = device_env(NV, {}, {f"{NV}/memory": {"requestPolicy": {}}})
    with pytest.raises(CelError, match=r"capacity gpu\.nvidia\.com/memory: .*needs a string, got None"):
        selects("true", env)
    env = device_env(NV, {f"{NV}/type": {"string": "gpu", "int": 1}}, {})
    with pytest.raises(CelError, match=r"attribute gpu\.nvidia\.com/type: needs exactly one of"):
        selects("true", env)
    env = device_env(NV, {f"{NV}/healthy": {"bool": "false"}}, {})
    with pytest.raises(CelError, match=r"attribute gpu\.nvidia\.com/healthy: bool needs a bool, got 'false'"):
        selects("true", env)
    assert selects("true", device_env(NV, {}, {f"{NV}/multiprocessors": {"value": 14}}))


def test_an_expression_over_the_length_limit_is_refused() -> None:
    long = "true && " * (MAX_EXPRESSION_LENGTH // 8) + "true"
    with pytest.raises(CelError, match=f"more than {MAX_EXPRESSION_LENGTH}"):
        compile_selector(long)


def test_each_expression_is_compiled_once() -> None:
    expr = f'device.attributes["{NV}"].type == "gpu" && device.driver == "{NV}"'
    first = compile_selector(expr)
    assert compile_selector(expr) is first
    assert first.expression == expr
    bad = "device.driver ==="
    with pytest.raises(CelError) as one:
        compile_selector(bad)
    with pytest.raises(CelError) as two:
        compile_selector(bad)
    assert one.value is two.value


def test_brackets_and_quotes_inside_keys_and_strings() -> None:
    env = device_env("x.example.com", {"x.example.com/name": {"string": 'a]["b'}}, {})
    assert selects('device.attributes["x.example.com"]["name"] == \'a]["b\'', env)
    assert selects('device.attributes["x.example." + "com"].name.endsWith(\'["b\') '
                   "// device.attributes[\n&& true", env)
    assert selects('device.attributes[["x.example.com"][0]].name.startsWith("a")', env)
    assert not selects('has(device.attributes[["y.example.com"][0]].name)', env)
