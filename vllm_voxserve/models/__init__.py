"""Model code (talker side, code predictor, codec) of the TTS models we serve."""
