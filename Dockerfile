# The gateway and the emulated workers in one slim image; `edgeroute serve` by default.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY policies policies
COPY oracle oracle
COPY workers workers
COPY edgeroute edgeroute
# The served ONNX actor and predictor, found beside the packages.
COPY models models
# Editable, so that the packages find `models/` beside them; no torch (training only).
RUN pip install --editable . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin edgeroute

USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('EDGEROUTE_PORT', '8000') + '/healthz', timeout=2)"]
ENTRYPOINT ["edgeroute"]
CMD ["serve", "--config", "/etc/edgeroute/gateway.yaml"]
