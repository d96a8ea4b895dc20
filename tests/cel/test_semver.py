import pytest

from dra_driver.k8s.semver import Semver, SemverError, is_semver, parse_semver


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.2.3", Semver(1, 2, 3)),
        ("550.54.15", Semver(550, 54, 15)),
        ("1.0.0-rc.1", Semver(1, 0, 0, ("rc", "1"))),
        ("1.0.0+build.5", Semver(1, 0, 0, (), ("build", "5"))),
        ("0.0.0", Semver(0, 0, 0)),
    ],
)
def test_parse_strict(text: str, expected: Semver) -> None:
    parsed = parse_semver(text)
    assert (parsed.major, parsed.minor, parsed.patch, parsed.prerelease, parsed.build) == (
        expected.major,
        expected.minor,
        expected.patch,
        expected.prerelease,
        expected.build,
    )
    assert str(parsed) == text


@pytest.mark.parametrize("text", ["1.2", "v1.2.3", "01.2.3", "1.2.3-01", "1.2.3-", "", "1.2.3.4", "a.b.c"])
def test_parse_strict_rejects(text: str) -> None:
    with pytest.raises(SemverError, match="invalid semver"):
        parse_semver(text)
    assert not is_semver(text)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [("v1.2.3", "1.2.3"), ("1.2", "1.2.0"), ("v2", "2.0.0"), ("01.02.03", "1.2.3"), ("1.2-beta", "1.2.0-beta")],
)
def test_normalize(text: str, normalized: str) -> None:
    assert str(parse_semver(text, normalize=True)) == normalized
    assert is_semver(text, True)


@pytest.mark.parametrize(
    ("lower", "higher"),
    [
        ("1.2.3", "1.2.4"),
        ("1.9.0", "1.10.0"),
        ("1.0.0-alpha", "1.0.0"),
        ("1.0.0-alpha", "1.0.0-alpha.1"),
        ("1.0.0-alpha.1", "1.0.0-alpha.beta"),
        ("1.0.0-beta.2", "1.0.0-beta.11"),
        ("1.0.0-rc.1", "1.0.0"),
        ("550.0.0", "550.54.15"),
    ],
)
def test_precedence(lower: str, higher: str) -> None:
    a, b = parse_semver(lower), parse_semver(higher)
    assert a.compare(b) == -1
    assert b.compare(a) == 1


def test_build_metadata_is_ignored_for_equality() -> None:
    assert parse_semver("1.0.0+a") == parse_semver("1.0.0+b")
    assert hash(parse_semver("1.0.0+a")) == hash(parse_semver("1.0.0"))
