# One image for all three roles (cloud verifier, link emulator, edge client);
# docker-compose.yml picks the entry point (splitspec-cloud, splitspec-edge,
# or the umbrella splitspec) and the command. CPU build; see README for GPU notes.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends build-essential cmake git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY edge edge
COPY cloud cloud
COPY shared shared
COPY sim sim
COPY protos protos
# The CPU build of torch (any other spec pulls a multi-GB CUDA build); llama.cpp portable AVX2.
RUN pip install --no-cache-dir torch==2.13.0 \
    && CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF" \
       pip install --no-cache-dir "llama-cpp-python>=0.3.8,<0.4" \
    && pip install --no-cache-dir ".[sim]"
ENV SPLITSPEC_CACHE=/cache OMP_WAIT_POLICY=PASSIVE
VOLUME /cache
ENTRYPOINT ["splitspec"]
