"""The browser's one page: a saved screenshot or PDF, opened from the call that saved it."""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse

from .artifacts import browser_artifact_open


@login_required
def artifact(request, call_id):
    opened = browser_artifact_open(user=request.user, call_id=call_id)
    if opened is None:
        raise Http404("No such file.")
    name, data, media_type = opened
    response = HttpResponse(data, content_type=media_type)
    response["Content-Disposition"] = f'inline; filename="{name}"'
    response["X-Content-Type-Options"] = "nosniff"
    return response
