"""compat_matrix.yaml: the single source of truth, loaded and validated into typed rows.

Why data and not code: which convention a MaxText release uses, which RPA call form a
tpu-inference version wants, and which environments the project tests for real change
with every upstream release. Keeping them in one validated file lets the runtime, the
CLI and the test matrix read the same facts.
"""

from maxtext_compat.matrix.environments import (
    EnvironmentSpec,
    parse_environment,
    valid_env_name,
)
from maxtext_compat.matrix.load import (
    MAX_MATRIX_BYTES,
    default_matrix_path,
    load_matrix,
    with_environments,
)
from maxtext_compat.matrix.parse import (
    parse_environments,
    parse_matrix,
)
from maxtext_compat.matrix.returns import RETURN_SHAPES, ReturnShape
from maxtext_compat.matrix.types import (
    CompatMatrix,
    ConfigSpec,
    CpuShimSpec,
    DefectCondition,
    Deprecation,
    KnownDefect,
    MaxTextRow,
    MetadataSpec,
    OptionalParams,
    Requirements,
    RpaSpec,
    TpiRelease,
    TpuInferenceRow,
    VllmPath,
)
from maxtext_compat.matrix.values import (
    CALL_FORMS,
    CALLER_CONVENTIONS,
    CLASS_KEYS,
    CONVENTIONS,
    DECODER_KINDS,
    DEFECT_REMEDIES,
    DEV_BUILD_PACKAGES,
    DEV_BUILD_RELATIONS,
    ENV_NAME_PATTERN,
    ENV_NAME_RULE,
    FAMILIES,
    MATRIX_ENV_VAR,
    OPTIONAL_CLASS_KEYS,
    OPTIONAL_PARAMS,
    POLICIES,
    SCHEMA_VERSION,
    ClassRef,
    Convention,
)

__all__ = [
    "CALLER_CONVENTIONS",
    "CALL_FORMS",
    "CLASS_KEYS",
    "CONVENTIONS",
    "DECODER_KINDS",
    "DEFECT_REMEDIES",
    "DEV_BUILD_PACKAGES",
    "DEV_BUILD_RELATIONS",
    "ENV_NAME_PATTERN",
    "ENV_NAME_RULE",
    "FAMILIES",
    "MATRIX_ENV_VAR",
    "MAX_MATRIX_BYTES",
    "OPTIONAL_CLASS_KEYS",
    "OPTIONAL_PARAMS",
    "POLICIES",
    "RETURN_SHAPES",
    "SCHEMA_VERSION",
    "ClassRef",
    "CompatMatrix",
    "ConfigSpec",
    "Convention",
    "CpuShimSpec",
    "DefectCondition",
    "Deprecation",
    "EnvironmentSpec",
    "KnownDefect",
    "MaxTextRow",
    "MetadataSpec",
    "OptionalParams",
    "Requirements",
    "ReturnShape",
    "RpaSpec",
    "TpiRelease",
    "TpuInferenceRow",
    "VllmPath",
    "default_matrix_path",
    "load_matrix",
    "parse_environment",
    "parse_environments",
    "parse_matrix",
    "valid_env_name",
    "with_environments",
]
