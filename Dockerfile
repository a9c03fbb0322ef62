# One image for every part of a deployment: `veil serve --role ...` (the entry point), and the Spark
# master and workers through `spark-class`, which the pyspark package ships. Executors run this
# image's Python, so the pipeline's code and libraries are the same on every machine.
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/veil
COPY pyproject.toml README.md ./
COPY veil ./veil
RUN pip install --no-cache-dir .
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
ENV PATH=$SPARK_HOME/bin:$PATH VEIL_DATA_DIR=/var/lib/veil PYSPARK_PYTHON=/usr/local/bin/python
VOLUME /var/lib/veil
EXPOSE 20000 20001 20002
ENTRYPOINT ["veil"]
CMD ["serve"]
