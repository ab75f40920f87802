"""Training the QoS-aware deep-RL router (PyTorch): features, HAN encoder, discrete SAC,
ONNX export. Serving needs only onnxruntime and `policies.qos_state`."""
