# syntax=docker/dockerfile:1
# Stage 1 builds the wheel (Rust core + Python package) with maturin.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN curl --proto '=https' -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain stable
ENV PATH=/root/.cargo/bin:$PATH
RUN pip install --no-cache-dir maturin==1.16.0
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY rust rust
COPY python python
RUN maturin build --release --locked --out /wheels

# Stage 2: a slim runtime with only the wheel and its dependencies, run as a
# non-root user.
FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/llmgw llmgw
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/*.whl && rm -rf /tmp/wheels
USER 10001:10001
WORKDIR /var/lib/llmgw
EXPOSE 8080
ENTRYPOINT ["llmgw"]
# In a container the gateway must listen beyond loopback to be reachable.
CMD ["up", "--host", "0.0.0.0"]
