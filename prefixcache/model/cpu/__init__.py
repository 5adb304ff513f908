"""The CPU compute backend and what only it uses: C++ kernels, huge-page placement,
oneDNN-prepacked linears."""
