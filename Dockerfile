# The headroom image: one image for the sidecar (`headroom run`), the lake's committer and maintenance
# (`headroom lake commit|maintain`) and the simulator (`headroom sim`). No token, key or model is baked in: configuration comes from
# flags and environment at run time (see docker-compose.yml and docs/operations.md).
#
#   docker build -t llm-headroom:local .
#   docker run --rm llm-headroom:local --help

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md* LICENSE ./
COPY collector ./collector
# the whole tool ([all]): this one image also runs the weekly review, the probe and the lake jobs
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[all]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 MPLCONFIGDIR=/tmp/matplotlib
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && useradd --system --uid 10001 --home-dir /data --create-home headroom \
 && install -d -o headroom -g headroom /data/db /data/spool
# /data/db (DuckDB) and /data/spool (--lake's write-ahead spool) are volumes; a new named volume takes this ownership.
USER 10001
WORKDIR /data
# 8000 simulator, 9100 sidecar (proxy + /metrics), 9101 its --admin-listen where given
EXPOSE 8000 9100 9101
ENTRYPOINT ["headroom"]
CMD ["--help"]
