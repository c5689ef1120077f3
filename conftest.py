# Root conftest: shared fixtures live in one module per resource so separate work never collides.
import pytest

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.broker",
    "tests.fixtures.pulsar",
    "tests.fixtures.s3",
    "tests.fixtures.s3rver",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files with a ``slow`` test run first, each file's tests in their order: two workers take whole files
    (``--dist loadfile``), and a long file started last runs alone at the end."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
