import pytest

from dra_driver.cel import MAX_EXPRESSION_LENGTH, CelCompileError, CelRuntimeError, DeviceInput, DraCelEnvironment
from dra_driver.defaults import DRIVER_NAME
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.k8s.semver import parse_semver

DEVICE = DeviceInput(
    driver=DRIVER_NAME,
    attributes={
        "productName": "NVIDIA H100 80GB HBM3",
        "index": 3,
        "mig": True,
        "driverVersion": parse_semver("550.54.15"),
        "pcie.example.com/root": "pci0000:00",
    },
    capacity={"memory": parse_quantity("80Gi"), "multiprocessors": parse_quantity("132")},
    allow_multiple_allocations=True,
)
A = f'device.attributes["{DRIVER_NAME}"]'
C = f'device.capacity["{DRIVER_NAME}"]'


@pytest.fixture(scope="module")
def env() -> DraCelEnvironment:
    return DraCelEnvironment()


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # the device variable and typed attributes
        (f'device.driver == "{DRIVER_NAME}"', True),
        (f'{A}.productName.startsWith("NVIDIA H100")', True),
        (f"{A}.index == 3", True),
        (f"{A}.index > 2 && {A}.mig", True),
        (f"{A}.mig == false", False),
        ('device.attributes["pcie.example.com"].root == "pci0000:00"', True),
        ("device.allowMultipleAllocations", True),
        # unknown domain -> empty map; guards
        ('"x" in device.attributes["unknown.example.com"]', False),
        ('size(device.attributes["unknown.example.com"]) == 0', True),
        (f"has({A}.productName) && !has({A}.nope)", True),
        (f'"nope" in {A} || {A}.index == 3', True),
        # quantity library
        (f'{C}.memory.compareTo(quantity("40Gi")) >= 0', True),
        (f'{C}.memory.compareTo(quantity("85899345920")) == 0', True),
        (f'{C}.memory == quantity("85899345920")', True),
        ('quantity("40Gi").compareTo(quantity("42949672960")) == 0', True),
        ('quantity("40Gi").isGreaterThan(quantity("42949672959"))', True),
        ('quantity("40Gi").isLessThan(quantity("40G"))', False),
        ('quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")', True),
        ('quantity("1Gi").add(1) == quantity("1073741825")', True),
        ('quantity("1").sub(quantity("1500m")).sign() == -1', True),
        ('quantity("2").sub(1).sign() == 1', True),
        ('quantity("0").sign() == 0', True),
        ('quantity("1.5").isInteger()', False),
        ('quantity("3k").isInteger() && quantity("3k").asInteger() == 3000', True),
        ('quantity("1500m").asApproximateFloat() == 1.5', True),
        ('isQuantity("40Gi") && !isQuantity("40GB")', True),
        (f"{C}.multiprocessors.asInteger() > 100", True),
        # semver library
        (f'{A}.driverVersion.isGreaterThan(semver("550.0.0"))', True),
        (f'{A}.driverVersion.isLessThan(semver("550.0.0"))', False),
        (f'{A}.driverVersion.compareTo(semver("550.54.15")) == 0', True),
        (f'{A}.driverVersion == semver("550.54.15")', True),
        (
            f"{A}.driverVersion.major() == 550 && {A}.driverVersion.minor() == 54 && {A}.driverVersion.patch() == 15",
            True,
        ),
        ('semver("v1.2", true) == semver("1.2.0")', True),
        ('isSemver("1.2.3") && !isSemver("v1.2.3") && isSemver("v1.2.3", true)', True),
        ('semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))', True),
    ],
)
def test_expressions(env: DraCelEnvironment, expression: str, expected: bool) -> None:
    assert env.matches(expression, DEVICE) is expected


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        (f"{A}.nope == 1", "no such key: nope"),
        ('device.attributes["unknown.example.com"].model == "x"', "no such key: model"),
        (f'{A}["nope"] == 1', "no such key: nope"),
        (f"{A}.index", "CEL result of type int could not be converted to bool"),
        (f"{A}.productName", "CEL result of type string could not be converted to bool"),
        ('quantity("40GB") == quantity("1")', "invalid quantity '40GB'"),
        ('quantity("1.5").asInteger() == 1', "cannot convert value to integer"),
        ('semver("1.2") == semver("1.2.0")', "invalid semver '1.2'"),
        (f'{A}.driverVersion.compareTo(quantity("1")) == 0',
         "no such overload: compareTo(kubernetes.Semver, kubernetes.Quantity)"),
        (f"{A}.index.major() == 1", "no such overload: major(int)"),
        (f"{A}.index.lowerAscii() == \"3\"", "no such overload: lowerAscii(int)"),
    ],
)
def test_runtime_errors_name_expression_and_reason(env: DraCelEnvironment, expression: str, fragment: str) -> None:
    with pytest.raises(CelRuntimeError) as err:
        env.matches(expression, DEVICE)
    assert fragment in str(err.value)
    assert err.value.expression == expression
    assert "CEL expression" in str(err.value)


def test_missing_attribute_error_suggests_guard(env: DraCelEnvironment) -> None:
    with pytest.raises(CelRuntimeError, match="guard with has"):
        env.matches(f"{A}.nope", DEVICE)


def test_allow_multiple_allocations_needs_the_gate() -> None:
    gated = DraCelEnvironment(consumable_capacity=False)
    # the scheduler's environment declares the field; without the gate the API server dropped it: false
    assert gated.matches("device.allowMultipleAllocations", DEVICE) is False
    # a per-device override wins over the environment default
    assert gated.compile("device.allowMultipleAllocations").matches(gated.activate(DEVICE, consumable_capacity=True))
    # a new selector naming it is refused by the API server without the gate
    new = DraCelEnvironment(consumable_capacity=False, new_expressions=True)
    with pytest.raises(CelCompileError, match="undefined field 'allowMultipleAllocations'"):
        new.compile("device.allowMultipleAllocations")


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ('quantity("1").compareTo(semver("1.0.0")) == 0',
         "found no matching overload for 'compareTo' applied to 'kubernetes.Quantity.(kubernetes.Semver)'"),
        ('quantity("1").add("x") == quantity("1")',
         "found no matching overload for 'add' applied to 'kubernetes.Quantity.(string)'"),
        (f"{A}.productName.frobnicate()", "undeclared reference to 'frobnicate' (in container '')"),
        (f"{A}.index == ", "Syntax error"),
        ("device.driver", "must evaluate to bool or the unknown type, not string"),
    ],
)
def test_compile_errors(env: DraCelEnvironment, expression: str, fragment: str) -> None:
    with pytest.raises(CelCompileError) as err:
        env.compile(expression)
    assert fragment in err.value.reason


def test_syntax_error_is_a_compile_error(env: DraCelEnvironment) -> None:
    with pytest.raises(CelCompileError, match="Syntax error") as err:
        env.compile("device.driver ==")
    assert err.value.expression == "device.driver =="


def test_expression_length_limit(env: DraCelEnvironment) -> None:
    prefix = 'device.driver == "'
    filler = "x" * (MAX_EXPRESSION_LENGTH - len(prefix) - 1)
    at_limit = prefix + filler + '"'
    assert len(at_limit) == MAX_EXPRESSION_LENGTH
    assert env.matches(at_limit, DEVICE) is False
    with pytest.raises(CelCompileError, match=f"10241 characters long; the limit is {MAX_EXPRESSION_LENGTH}"):
        env.compile(prefix + filler + 'x"')


def test_empty_expression_rejected(env: DraCelEnvironment) -> None:
    with pytest.raises(CelCompileError, match="empty"):
        env.compile("   ")


def test_compiled_programs_are_cached_and_bounded() -> None:
    env = DraCelEnvironment(cache_size=2)
    first = env.compile("true")
    assert env.compile("true") is first
    with pytest.raises(CelCompileError) as bad1:
        env.compile("(")
    with pytest.raises(CelCompileError) as bad2:
        env.compile("(")
    assert bad1.value is bad2.value  # compile errors are cached too
    env.compile("false")  # evicts the least recently used entry ("true")
    assert env.cache_info() == (2, 2)
    assert env.compile("true") is not first
    with pytest.raises(ValueError, match="cache_size"):
        DraCelEnvironment(cache_size=0)


def test_a_device_activation_is_reusable_across_selectors(env: DraCelEnvironment) -> None:
    activation = env.activate(DEVICE)
    assert env.compile(f"{A}.index == 3").matches(activation)
    assert env.compile(f'{C}.memory.isGreaterThan(quantity("79Gi"))').matches(activation)
