"""Which tracking-store URI schemes this install can serve: sqlite and http(s) always (and `file:` where MLflow still
allows it); a database SQLAlchemy reaches through a driver only when that driver is installed. A URI of any other
scheme would otherwise fail deep inside MLflow with an ImportError; agentrl.tracking.store refuses it in one line."""
from __future__ import annotations

# database stores SQLAlchemy serves through a driver of their own (the driver's module, by SQLAlchemy's name for it)
DB_DRIVERS = {"postgresql": {"psycopg2": "psycopg2", "psycopg": "psycopg", "pg8000": "pg8000"},
              "mysql": {"mysqldb": "MySQLdb", "pymysql": "pymysql", "mysqlconnector": "mysql.connector"},
              "mssql": {"pyodbc": "pyodbc", "pymssql": "pymssql"}}
DEFAULT_DRIVER = {"postgresql": "psycopg2", "mysql": "mysqldb", "mssql": "pyodbc"}
SUPPORTED = "sqlite:///PATH, http(s)://HOST[:PORT]"


def _installed(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def scheme_problem(uri: str) -> str | None:
    """Why this install cannot serve the URI's scheme (a database driver it lacks, or a scheme it has no store
    for), or None."""
    scheme = uri.split("://", 1)[0] if "://" in uri else uri.split(":", 1)[0]
    base, _, driver = scheme.lower().partition("+")
    if base in ("sqlite", "http", "https", "file"):
        return None
    if base in DB_DRIVERS:
        driver = driver or DEFAULT_DRIVER[base]
        module = DB_DRIVERS[base].get(driver)
        if module is not None and _installed(module):
            return None
        return (f"the {scheme} scheme needs the {module or driver} driver, which this install lacks (pip install "
                f"it into .venv to use that database)")
    return f"this install has no store for the {scheme!r} scheme"
