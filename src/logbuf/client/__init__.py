"""The client side: publications, subscriptions and images over log buffers."""
