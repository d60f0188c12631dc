"""One import point for `django.tasks` (Django 6.x) and its backport (5.2).

The rest of the package imports these names from here only, so the choice
of source is made once.
"""

from __future__ import annotations

try:  # Django 6.x ships the framework.
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        Task,
        TaskError,
    )
    from django.tasks.base import task as base_task
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import (
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )
    from django.tasks.signals import logger as tasks_logger

    BUILTIN = True
except ImportError:  # Django 5.2 with the django-tasks backport.
    from django_tasks import (  # type: ignore[no-redef]
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
    from django_tasks.base import (  # type: ignore[no-redef]
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        Task,
        TaskError,
    )
    from django_tasks.base import task as base_task  # type: ignore[no-redef]
    from django_tasks.exceptions import (  # type: ignore[no-redef]
        InvalidTaskError as InvalidTask,
    )
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
    from django_tasks.signals import (  # type: ignore[no-redef]
        log_task_enqueued,
        log_task_finished,
        log_task_started,
        task_enqueued,
        task_finished,
        task_started,
    )
    from django_tasks.signals import logger as tasks_logger  # type: ignore[no-redef]

    BUILTIN = False

__all__ = [
    "BUILTIN",
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "TASK_REFRESH_ATTRS",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "base_task",
    "log_task_enqueued",
    "log_task_finished",
    "log_task_started",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
    "tasks_logger",
]
